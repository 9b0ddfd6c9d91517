#!/usr/bin/env bash
# What the cluster tier's test bed (testbed/) needs, from Debian, on a fresh machine:
#   iproute2, util-linux     network namespaces, veths, a bridge; unshare/nsenter
#   slurm-wlm, munge         real slurmctld/slurmd/srun, started per test bed by lockstep_testbed.slurm
#   openmpi-bin              real mpirun/orted, lockstep_testbed.mpi
# Idempotent: when every command is already there it exits at once, with no apt-get call.
# Needs root (the bed itself needs it too); `apt-get update` runs at most once per call.
# The Debian units for munge/slurm are never started, nor left enabled at boot: the bed runs its
# own daemons inside its own namespaces and writes no system configuration.
#
# While apt installs them, a policy-rc.d of lockstep's own keeps their services from starting
# (munge and slurm* only: any other service is decided as if it were not there). It names this
# run's pid and the units it installs, so a run killed by SIGKILL (which runs no trap) is
# finished by the next one, even when nothing is left to install: that run removes the file,
# completes dpkg's configuration under its own policy and disables the units at boot. A
# policy-rc.d that is not lockstep's, or whose run is still going, is left alone.
# DPKG_ROOT, as invoke-rc.d and update-rc.d read it, stands for / (tests use a folder).
set -euo pipefail

root=${DPKG_ROOT:-}
sbin=$root/usr/sbin
policy=$sbin/policy-rc.d
made_policy=
# Line 2 of lockstep's policy-rc.d: MARK<pid> units=<unit ...>: ...
MARK='# lockstep ci/install-cluster.sh pid='

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have ip || need+=(iproute2)
have unshare && have nsenter || need+=(util-linux)
have slurmctld && have slurmd && have srun || need+=(slurm-wlm)
have munged && have mungekey || need+=(munge)
have mpirun && have orted || need+=(openmpi-bin)

# The pid and the units a file of lockstep's names (nothing for anyone else's file).
field() { sed -n "2s|^${MARK//./\\.}\\([0-9][0-9]*\\) units=\\([a-z ]*\\):.*|\\$1|p" "$2" 2>/dev/null || true; }
running() { kill -0 "$1" 2>/dev/null && grep -qa install-cluster "/proc/$1/cmdline" 2>/dev/null; }

# A killed run's policy-rc.d (or its temporary copy): its units still to disable.
left=()
for file in "$policy" "$sbin"/.policy-rc.d.lockstep-*; do
	[ -f "$file" ] || continue
	pid=$(field 1 "$file")
	if [ -z "$pid" ] || { [ "$pid" != "$$" ] && running "$pid"; }; then
		continue
	fi
	read -ra units <<<"$(field 2 "$file")"
	left+=("${units[@]}")
	rm -f "$file" 2>/dev/null && [ ! -e "$file" ] || {
		echo "install-cluster: $file was left by run $pid, killed before it removed it; remove it as root" >&2
		exit 1
	}
	echo "install-cluster: removed $file, left by run $pid (killed before it removed it)"
done

if [ ${#need[@]} -eq 0 ] && [ ${#left[@]} -eq 0 ]; then
	echo "install-cluster: all present (ip, unshare, nsenter, slurmctld, slurmd, srun, munged, mpirun)"
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "install-cluster: needs root to install ${need[*]}" >&2
	exit 1
fi

# The units this run installs, and those a killed run left enabled: each once.
units=()
for unit in "${left[@]}" $(printf '%s\n' "${need[@]}" | sed -n 's/^munge$/munge/p; s/^slurm-wlm$/slurmctld slurmd/p'); do
	case " ${units[*]} " in *" $unit "*) ;; *) units+=("$unit") ;; esac
done

cleanup() {
	if [ -n "$made_policy" ] && [ "$(field 1 "$policy")" = "$$" ]; then rm -f "$policy"; fi
	rm -f "$sbin/.policy-rc.d.lockstep-$$"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# Written whole under a temporary name, then linked into place only where no policy-rc.d is.
tmp=$sbin/.policy-rc.d.lockstep-$$
cat >"$tmp" <<EOF
#!/bin/sh
${MARK}$$ units=${units[*]}: munge's and slurm's services are not started while it installs
# them; any other service is decided as if this file were not here. A later run of
# install-cluster.sh removes this file once that run is gone, and finishes its work.
for arg; do case \$arg in --*) ;; *) id=\$arg; break ;; esac; done
case \${id:-} in
munge | munge.service | slurm*) exit 101 ;;
esac
test -e "\${DPKG_ROOT:-}/sbin/init" || exit 101 # as invoke-rc.d without a policy-rc.d
exit 0
EOF
chmod 755 "$tmp"
if ln "$tmp" "$policy" 2>/dev/null; then made_policy=1; fi
rm -f "$tmp"

export DEBIAN_FRONTEND=noninteractive
if [ ${#left[@]} -gt 0 ]; then
	echo "install-cluster: finishing the configuration a killed run left (dpkg --configure -a)"
	dpkg --configure -a
fi
if [ ${#need[@]} -gt 0 ]; then
	echo "install-cluster: installing ${need[*]}"
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
for cmd in ip unshare nsenter slurmctld slurmd srun munged mpirun orted; do
	have "$cmd" || {
		echo "install-cluster: $cmd still missing after installing ${need[*]}" >&2
		exit 1
	}
done
# The packages' scripts enable their units at boot (SysV rc links, and systemd's, which
# update-rc.d keeps in step through systemctl --root): disabled again, as said above.
for unit in "${units[@]}"; do
	if [ -e "$root/etc/init.d/$unit" ]; then
		update-rc.d "$unit" disable >/dev/null
	elif have systemctl; then
		systemctl --root="${root:-/}" --quiet disable "$unit.service" 2>/dev/null || true
	fi
done
[ ${#units[@]} -eq 0 ] || echo "install-cluster: not started at boot: ${units[*]}"
echo "install-cluster: done ($(slurmctld -V), Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}'))"
