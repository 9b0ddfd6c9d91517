#!/usr/bin/env bash
# Fail unless exactly one NCCL is in the image: the torch wheel's (nvidia-nccl-*, in the venv).
# A second libnccl beside it (a system libnccl2, a copy in another package) is how ranks end up
# on different NCCLs ("undefined symbol: ncclCommRegister", "message truncated"). The image build
# runs it after the lock's install; the docker tier runs it again in the finished image, as root
# (every folder readable). A failure is one line naming every copy found.
set -euo pipefail

venv=/opt/lockstep/venv
mapfile -t found < <(find / -xdev -path /proc -prune -o -name 'libnccl*.so*' -print 2>/dev/null | sort)
mapfile -t in_venv < <(printf '%s\n' "${found[@]}" | grep "^$venv/" || true)
if ((${#found[@]} != 1 || ${#in_venv[@]} != 1)); then
	echo "check-one-nccl: ${#found[@]} copies of libnccl*.so* in the image, exactly one (the venv's nvidia-nccl wheel) allowed: ${found[*]:-none}" >&2
	exit 1
fi
echo "check-one-nccl: ${found[0]}"
