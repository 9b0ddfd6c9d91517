"""ci/install-cluster.sh, run for real on a folder standing for / (DPKG_ROOT) with apt-get,
dpkg and update-rc.d stubbed on a PATH of their own: the stub apt-get does what the Debian
packages' maintainer scripts do (enables munge and slurm at boot, asks policy-rc.d before
starting them, as invoke-rc.d does), and can stall there so that the script is killed by SIGKILL
in the middle of apt, as a cancelled CI job or the OOM killer would.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "install-cluster.sh"
COMMANDS = ["ip", "unshare", "nsenter", "slurmctld", "slurmd", "srun", "munged", "mungekey"]
COMMANDS += ["mpirun", "orted"]
# What the script and the stubs run from the machine (nothing of Slurm, MPI or iproute2).
TOOLS = ["bash", "sh", "env", "sed", "grep", "rm", "ln", "chmod", "cat", "head", "awk", "sleep"]
TOOLS += ["mkdir", "touch", "mv", "kill", "printf"]

APT_GET = r"""#!/bin/sh
# apt-get as the packages would behave: their commands appear, their postinst enables the units
# at boot (rc links) and asks policy-rc.d before starting them; `cron` stands for any other
# package's service. With $STALL it stops in the middle, until killed.
echo "apt-get $*" >>"$LOG"
[ "$1" = update ] && exit 0
policy=$DPKG_ROOT/usr/sbin/policy-rc.d
ask() {
	if [ -x "$policy" ]; then "$policy" "$@" >/dev/null; echo "start $1: $?" >>"$LOG"
	else echo "start $1: no policy-rc.d" >>"$LOG"; fi
}
for package; do
	case $package in munge) units=munge ;; slurm-wlm) units="slurmctld slurmd" ;; *) continue ;; esac
	for unit in $units; do
		printf '#!/bin/sh\n' >"$DPKG_ROOT/etc/init.d/$unit"
		ln -sf "../init.d/$unit" "$DPKG_ROOT/etc/rc2.d/S01$unit"
		ask "$unit" start
		ask "$unit.service" start
	done
done
ask --quiet cron start
if [ -n "${STALL:-}" ]; then touch "$STALL"; sleep 60; fi
for cmd in ip unshare nsenter slurmctld slurmd srun munged mungekey mpirun orted; do
	printf '#!/bin/sh\necho "%s 1.0"\n' "$cmd" >"$BIN/$cmd"
	chmod 755 "$BIN/$cmd"
done
"""
UPDATE_RC_D = r"""#!/bin/sh
# update-rc.d NAME disable: the rc links of NAME become K links (systemd's follow, on a host)
echo "update-rc.d $*" >>"$LOG"
[ "$2" = disable ] && mv "$DPKG_ROOT/etc/rc2.d/S01$1" "$DPKG_ROOT/etc/rc2.d/K01$1"
"""
DPKG = '#!/bin/sh\necho "dpkg $*" >>"$LOG"\n'
ID = "#!/bin/sh\necho 0\n"  # the script's root check; everything it writes is in the folder


class Host:
    """A folder standing for /, a PATH of the tools above and the stubs, and a log of calls."""

    def __init__(self, tmp_path: Path) -> None:
        assert "DPKG_ROOT" in SCRIPT.read_text(), "never run it on this machine's /usr/sbin"
        self.root = tmp_path / "root"
        self.bin = tmp_path / "bin"
        self.log = tmp_path / "calls.log"
        for folder in ("usr/sbin", "etc/init.d", "etc/rc2.d", "sbin"):
            (self.root / folder).mkdir(parents=True)
        (self.root / "sbin" / "init").touch()  # a host with an init system
        self.bin.mkdir()
        for tool in TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool))
        for name, text in {
            "apt-get": APT_GET, "update-rc.d": UPDATE_RC_D, "dpkg": DPKG, "id": ID
        }.items():  # fmt: skip
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.policy = self.root / "usr" / "sbin" / "policy-rc.d"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": str(self.bin), "DPKG_ROOT": str(self.root), "LOG": str(self.log),
            "BIN": str(self.bin), **extra,
        }  # fmt: skip

    def run(self) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.bin / "bash"), str(SCRIPT)],
            env=self.env(), capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def links(self) -> list[str]:
        return sorted(p.name for p in (self.root / "etc" / "rc2.d").iterdir())

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in (self.root / "usr" / "sbin").glob("*policy-rc.d*"))

    def ask(self, *args: str) -> int:
        return subprocess.run([str(self.policy), *args], env=self.env(), check=False).returncode


def test_an_install_leaves_munge_and_slurm_off_at_boot(tmp_path):
    host = Host(tmp_path)
    result = host.run()
    assert result.returncode == 0, result.stderr
    # the postinst scripts enabled them at boot; the script disables them again
    assert host.links() == ["K01munge", "K01slurmctld", "K01slurmd"]
    assert "not started at boot: slurmctld slurmd munge" in result.stdout


def test_an_install_keeps_munge_and_slurm_from_starting_and_no_other_service(tmp_path):
    host = Host(tmp_path)
    result = host.run()
    assert result.returncode == 0, result.stderr
    calls = host.calls()
    for unit in ("munge", "munge.service", "slurmctld", "slurmd.service"):
        assert f"start {unit}: 101" in calls, calls  # refused while apt ran
    assert "start --quiet: 0" in calls, "any other service is decided as without the file"
    assert host.leftovers() == []


def test_a_run_killed_by_sigkill_during_apt_is_finished_by_the_next_run(tmp_path):
    host = Host(tmp_path)
    stalled = tmp_path / "stalled"
    first = subprocess.Popen(
        [str(host.bin / "bash"), str(SCRIPT)], env=host.env(STALL=str(stalled)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not stalled.exists():
        assert first.poll() is None and time.monotonic() < deadline, "never reached apt"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the script and its apt-get: no trap runs
    assert first.wait(timeout=30) == -signal.SIGKILL
    assert host.leftovers() == ["policy-rc.d"], "the kill left the file behind"
    # what is left refuses munge's and slurm's services, and no other
    assert host.ask("munge", "start") == 101 and host.ask("slurmd.service", "start") == 101
    assert host.ask("--quiet", "cron", "start") == 0
    assert host.ask("ssh.service", "restart") == 0

    second = host.run()
    assert second.returncode == 0, second.stderr
    assert host.leftovers() == [], "the next run removed it"
    assert f"removed {host.policy}, left by run {first.pid}" in second.stdout
    calls = host.calls()
    configure, install = calls.index("dpkg --configure -a"), len(calls) - 1 - calls[::-1].index(
        "apt-get install -y -qq --no-install-recommends iproute2 util-linux slurm-wlm munge openmpi-bin"
    )  # fmt: skip
    assert configure < install, "dpkg's interrupted configuration is completed first"
    assert calls[install + 1 :].count("start munge: 101") == 1, "under the new run's own policy"
    assert host.links() == ["K01munge", "K01slurmctld", "K01slurmd"]


def test_a_leftover_is_removed_and_its_units_disabled_even_with_nothing_to_install(tmp_path):
    host = Host(tmp_path)
    for cmd in COMMANDS:
        (host.bin / cmd).write_text(f'#!/bin/sh\necho "{cmd} 1.0"\n')
        (host.bin / cmd).chmod(0o755)
    for unit in ("munge", "slurmd"):
        (host.root / "etc" / "init.d" / unit).write_text("#!/bin/sh\n")
        (host.root / "etc" / "rc2.d" / f"S01{unit}").symlink_to(f"../init.d/{unit}")
    dead = subprocess.Popen(["true"])  # a pid whose run is over
    dead.wait()
    host.policy.write_text(
        f"#!/bin/sh\n# lockstep ci/install-cluster.sh pid={dead.pid} units=munge slurmd: x\nexit 101\n"
    )
    host.policy.chmod(0o755)
    result = host.run()
    assert result.returncode == 0, result.stderr
    assert host.leftovers() == []
    assert "dpkg --configure -a" in host.calls() and not any(
        c.startswith("apt-get") for c in host.calls()
    )
    assert host.links() == ["K01munge", "K01slurmd"]


@pytest.mark.parametrize("whose", ["docker", "a live run"])
def test_a_policy_rc_d_of_someone_else_or_of_a_live_run_is_left_alone(tmp_path, whose):
    host = Host(tmp_path)
    # its own process group: the kill below takes the shell's `sleep` with it
    live = subprocess.Popen(["bash", "-c", "sleep 60; :", "install-cluster.sh"],
                            start_new_session=True)  # fmt: skip
    try:
        text = (
            "#!/bin/sh\n# prevents services from starting in docker build\nexit 101\n"
            if whose == "docker"
            else f"#!/bin/sh\n# lockstep ci/install-cluster.sh pid={live.pid} units=munge: x\n"
            "exit 101\n"
        )
        host.policy.write_text(text)
        host.policy.chmod(0o755)
        result = host.run()
        assert result.returncode == 0, result.stderr
        assert host.policy.read_text() == text and host.leftovers() == ["policy-rc.d"]
    finally:
        os.killpg(live.pid, signal.SIGKILL)
        live.wait()
