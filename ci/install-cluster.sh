#!/usr/bin/env bash
# What the cluster tier's test bed (src/lockstep/cluster/) needs, from Debian, on a fresh machine:
#   iproute2, util-linux     network namespaces, veths, a bridge; unshare/nsenter
#   slurm-wlm, munge         real slurmctld/slurmd/srun, started per test bed by lockstep.cluster.slurm
#   openmpi-bin              real mpirun/orted, lockstep.cluster.mpi
# Idempotent: when every command is already there it exits at once, with no apt-get call.
# Needs root (the bed itself needs it too); `apt-get update` runs at most once per call.
# The Debian units for munge/slurm are never started: the bed runs its own daemons inside its
# own namespaces and writes no system configuration.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have ip || need+=(iproute2)
have unshare && have nsenter || need+=(util-linux)
have slurmctld && have slurmd && have srun || need+=(slurm-wlm)
have munged && have mungekey || need+=(munge)
have mpirun && have orted || need+=(openmpi-bin)

if [ ${#need[@]} -eq 0 ]; then
	echo "install-cluster: all present (ip, unshare, nsenter, slurmctld, slurmd, srun, munged, mpirun)"
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "install-cluster: needs root to install ${need[*]}" >&2
	exit 1
fi
echo "install-cluster: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages' postinst scripts must not start munge/slurm services on the host.
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod 755 "$policy"
	made_policy=1
fi
cleanup() { if [ -n "$made_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
for cmd in ip unshare nsenter slurmctld slurmd srun munged mpirun orted; do
	have "$cmd" || {
		echo "install-cluster: $cmd still missing after installing ${need[*]}" >&2
		exit 1
	}
done
echo "install-cluster: done ($(slurmctld -V), Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}'))"
