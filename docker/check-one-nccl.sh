#!/usr/bin/env bash
# Fail the image build unless exactly one NCCL is present: the torch wheel's (nvidia-nccl-*).
# A system libnccl beside it is how ranks end up on different NCCLs ("undefined symbol:
# ncclCommRegister", "message truncated").
set -euo pipefail

venv=/opt/lockstep/venv
mapfile -t system < <(find / -xdev \( -path /proc -o -path "$venv" \) -prune -o -name 'libnccl*.so*' -print)
mapfile -t wheel < <(find "$venv" -name 'libnccl.so*')
if ((${#system[@]})); then
	echo "check-one-nccl: system NCCL found beside the wheel's: ${system[*]}" >&2
	exit 1
fi
if ((${#wheel[@]} != 1)); then
	echo "check-one-nccl: expected one libnccl.so in $venv, found ${#wheel[@]}: ${wheel[*]}" >&2
	exit 1
fi
echo "check-one-nccl: ${wheel[0]}"
