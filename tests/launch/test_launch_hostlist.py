"""Slurm host lists both ways: what Slurm writes, expanded; the short form it takes back."""

from __future__ import annotations

import pytest

from lockstep.errors import UsageError
from lockstep.launch import hostlist


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("ls[0-3]", ["ls0", "ls1", "ls2", "ls3"]),
        ("gpu[07-09,12],cpu1", ["gpu07", "gpu08", "gpu09", "gpu12", "cpu1"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("node-a,node-b", ["node-a", "node-b"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
    ],
)
def test_expand_and_compress_round_trip(spec, hosts):
    assert hostlist.expand(spec) == hosts
    assert hostlist.expand(hostlist.compress(hosts)) == hosts


def test_compress_is_short():
    assert hostlist.compress(["ls2", "ls0", "ls1", "ls2"]) == "ls[0-2]"
    assert hostlist.compress(["ls3"]) == "ls3"
    assert hostlist.compress(["gpu07", "gpu09", "login"]) == "gpu[07,09],login"


@pytest.mark.parametrize(
    "spec", ["", "ls[0-3", "ls0]", "ls[3-1]", "ls[a]", "ls[[0]]", "a,,b", "a b"]
)
def test_unreadable_host_lists_are_usage_errors(spec):
    with pytest.raises(UsageError, match="host list"):
        hostlist.expand(spec)
