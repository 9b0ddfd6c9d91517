"""The bed's network, as a node's administrator would change it: `ip` and `tc` in a node's
network namespace, its interface renamed, its link to the bridge down or up, its traffic
shaped (`tc tbf` for the node, `htb` for one pair), its TCP connections listed.

`Network` is mixed into `Cluster` (bed.py); it uses the bed's `name`, `address`, `subnet` and
`run`, and keeps the renamed interfaces in `_ifnames`.
"""

from __future__ import annotations

from lockstep_testbed.namespaces import BRIDGE, HEAD, INTERFACE

# Every node's link, shaped as the bed starts (`tc tbf` both ways, see `rate_limit`): a clean
# link's speed is then tc's, the same on every pair, not what this machine's busy cores leave
# (unshaped, preflight's link stage named slow nodes on clean beds). 1 Gbit/s holds on all
# pairs at once on a 2-core machine (clean 8-node links at 0.89-1.01 of their median, 4 nodes
# 0.99-1.01); a burst of 128 KiB passes a veth's 64 KiB GSO packets whole (a smaller one makes
# tbf cut them into MTU packets, at a CPU cost), and preflight's 4 MiB messages are 32 of it.
# None: unshaped.
LINK_RATE: str | None = "1gbit"
LINK_BURST = "128kb"


class Network:
    """`Cluster`'s network hooks (see the module's docstring)."""

    link_rate: str | None
    link_burst: str
    _ifnames: dict[str, str]  # node -> its renamed interface (default eth0)

    def interface(self, k: int | str) -> str:
        """The node's interface on the bridge (the head's is the bridge itself)."""
        name = self.name(k)
        return BRIDGE if name == self.head else self._ifnames.get(name, INTERFACE)

    def ip(self, k: int | str, *args: str, timeout: float = 10.0) -> str:
        """`ip ARGS` in node k's network namespace (on the head: where the bridge and the
        nodes' veths `v<name>` live)."""
        return self.run(k, ["ip", *args], timeout=timeout, check=True).stdout

    def tc(self, k: int | str, *args: str, timeout: float = 10.0) -> str:
        return self.run(k, ["tc", *args], timeout=timeout, check=True).stdout

    def rename_interface(self, k: int | str, new: str) -> None:
        """Rename node k's eth0 (a node whose NIC is named differently)."""
        old = self.interface(k)
        self.ip(k, "link", "set", old, "down")
        self.ip(k, "link", "set", old, "name", new)
        self.ip(k, "link", "set", new, "up")
        self.ip(k, "route", "replace", self.subnet, "dev", new)
        self._ifnames[self.name(k)] = new

    def link(self, k: int | str, up: bool) -> None:
        """Take node k's link to the bridge down or up (its veth on the head's side)."""
        self.ip(HEAD, "link", "set", f"v{self.name(k)}", "up" if up else "down")

    def rate_limit(self, k: int | str, rate: str = "10mbit", burst: str = "32kbit") -> None:
        """Rate-limit node k's traffic both ways with `tc tbf` (netem does not exist here)."""
        for where, dev in ((k, self.interface(k)), (HEAD, f"v{self.name(k)}")):
            self.tc(
                where,
                *("qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate),
                *("burst", burst, "latency", "50ms"),
            )

    def clear_rate_limit(self, k: int | str) -> None:
        """Undo `rate_limit(k)` (or `rate_limit_pair`): node k's link back to the bed's own
        shaping (`link_rate`), or unshaped."""
        if self.link_rate:
            self.rate_limit(k, self.link_rate, self.link_burst)
            return
        for where, dev in ((k, self.interface(k)), (HEAD, f"v{self.name(k)}")):
            self.run(where, ["tc", "qdisc", "del", "dev", dev, "root"], timeout=10)

    def tcp_peers(self, k: int | str) -> list[tuple[int, str, int]]:
        """Node k's established TCP connections as (local port, peer address, peer port),
        from /proc/net/tcp in its network namespace."""
        out = []
        for line in self.run(k, ["cat", "/proc/net/tcp"], timeout=10).stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "01":  # 01: ESTABLISHED
                continue
            local, peer = fields[1], fields[2]
            addr = ".".join(str(int(peer[i : i + 2], 16)) for i in (6, 4, 2, 0))
            out.append((int(local.split(":")[1], 16), addr, int(peer.split(":")[1], 16)))
        return out

    def rate_limit_pair(
        self,
        a: int | str,
        b: int | str,
        rate: str,
        *,
        others: str = "10gbit",
        burst: str = "64kb",
    ) -> None:
        """Slow the link between nodes a and b only: on each one's interface an `htb` root whose
        default class carries its other traffic at `others` and a class at `rate` that a u32
        filter on the peer's address feeds (replaces a `rate_limit` on those interfaces; the
        head's side keeps its own)."""
        for me, peer in ((a, b), (b, a)):
            dev = self.interface(me)
            shown = self.tc(me, "qdisc", "show", "dev", dev)
            if "qdisc tbf" in shown or "qdisc htb" in shown:
                self.tc(me, "qdisc", "del", "dev", dev, "root")
            self.tc(me, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
            for cls, speed in (("1:10", others), ("1:20", rate)):
                self.tc(
                    me,
                    *("class", "add", "dev", dev, "parent", "1:", "classid", cls, "htb"),
                    *("rate", speed, "ceil", speed, "burst", burst, "cburst", burst),
                )
            self.tc(
                me,
                *("filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1"),
                *("u32", "match", "ip", "dst", f"{self.address(peer)}/32", "flowid", "1:20"),
            )
