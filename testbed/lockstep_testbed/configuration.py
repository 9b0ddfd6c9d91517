"""A node's own configuration, as a drifted node would have it: its environment (what a login
shell, the MPI remote agent and Slurm's TaskProlog see there), its /etc/hosts, the version of a
package its venv shows.

`NodeConfiguration` is mixed into `Cluster` (bed.py); it uses the bed's `name`, `names`,
`environ`, `state_path`, `running`, `run` and `python`, and keeps the bind mounts it made in
`_overlays`.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from lockstep_testbed.errors import BedError
from lockstep_testbed.namespaces import STATE


class NodeConfiguration:
    """`Cluster`'s configuration hooks (see the module's docstring)."""

    node_env: dict[str, dict[str, str]]  # node -> its own variables
    _overlays: dict[str, list[str]]  # node -> the mount points of its package overlays

    def set_node_env(self, k: int | str, **variables: str) -> None:
        """Variables only node k's commands see (what a node's drifted profile would set):
        `run`/`popen` on the node, the MPI remote agent and Slurm tasks (TaskProlog) there."""
        name = self.name(k)
        self.node_env[name].update(variables)
        self._write_profile(name)

    def _write_profile(self, name: str) -> None:
        """`nodes/<name>/profile`: node's whole environment as shell exports (what the MPI
        remote agent starts a node's daemon with, like a login shell there); `taskenv`: only the
        node's own variables, NAME=value lines (Slurm's TaskProlog exports them to its tasks)."""
        if not self.running:
            return
        env = self.environ(name)
        self.state_path("nodes", name, "profile").write_text(
            "".join(f"export {n}={shlex.quote(v)}\n" for n, v in sorted(env.items()))
        )
        self.state_path("nodes", name, "taskenv").write_text(
            "".join(f"{n}={v}\n" for n, v in self.node_env[name].items())
        )

    def write_profiles(self) -> None:
        for name in self.names:
            self._write_profile(name)

    def hosts(self, k: int | str) -> str:
        """Node k's /etc/hosts."""
        return self.state_path("nodes", self.name(k), "hosts").read_text()

    def write_hosts(self, k: int | str, text: str) -> None:
        """Replace node k's /etc/hosts (in place: the node's bind mount sees it at once)."""
        with open(self.state_path("nodes", self.name(k), "hosts"), "r+") as f:
            f.truncate(0)
            f.write(text)

    def drop_host(self, k: int | str, hostname: str) -> None:
        """Remove `hostname` from node k's /etc/hosts (it then no longer resolves there)."""
        keep = [
            ln for ln in self.hosts(k).splitlines(keepends=True) if hostname not in ln.split()[1:]
        ]
        self.write_hosts(k, "".join(keep))

    def overlay_package(self, k: int | str, name: str, version: str) -> str:
        """Make node k see distribution `name` at `version` (a node whose venv drifted): a
        copy of its `.dist-info` with that Version, bind-mounted over the original in node
        k's mount namespace only; `importlib.metadata` (and lockstep's fingerprint) there
        reads the new version, every other node the real one. Returns the dist-info path;
        `remove_overlays(k)` undoes it."""
        node = self.name(k)
        where = subprocess.run(
            [
                self.python,
                "-c",
                "import importlib.metadata as m, sys; print(m.distribution(sys.argv[1])._path)",
                name,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if where.returncode:
            raise BedError(f"{node}: no distribution {name!r} in {self.python}")
        original = Path(where.stdout.strip())
        copy = self.state_path("nodes", node, "overlay", original.name)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(original, copy)
        for meta in ("METADATA", "PKG-INFO"):
            path = copy / meta
            if path.exists():
                head, sep, body = path.read_text().partition("\n\n")
                lines = [
                    f"Version: {version}" if ln.startswith("Version: ") else ln
                    for ln in head.splitlines()
                ]
                path.write_text("\n".join(lines) + sep + body)
        inside = f"{STATE}/nodes/{node}/overlay/{original.name}"
        self.run(k, ["mount", "--bind", inside, str(original)], check=True, timeout=10)
        self._overlays[node].append(str(original))
        return str(original)

    def remove_overlays(self, k: int | str) -> None:
        node = self.name(k)
        while self._overlays[node]:
            self.run(k, ["umount", self._overlays[node].pop()], check=True, timeout=10)
