"""`lockstep.compat`: what lockstep changes of torch's private behaviour gives torch's own answer."""

from __future__ import annotations

import inspect
import os
import tempfile

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from lockstep.compat import disown_temporary_folders, remove_temporary_folders
from lockstep.launch.cleanup import launch_scope


def _torchs_name(depth: int) -> str:
    """torch's own `get_method_name`, as written in dynamic_rendezvous.py."""
    if len(inspect.stack()) > depth:
        return inspect.stack()[depth].function
    return "no_method_name"


def _named_by(get_method_name, depth: int) -> str:
    def record():  # the handler's `_record`, which names its caller
        return get_method_name(depth)

    def next_rendezvous():
        return record()

    return next_rendezvous()


# 2: torch's only use (the caller of `_record`); 10,000: deeper than the stack
@pytest.mark.parametrize("depth", [1, 2, 3, 10_000])
def test_a_launch_names_rendezvous_events_as_torch_does_without_inspect_stack(depth, monkeypatch):
    expected = _named_by(_torchs_name, depth)
    with launch_scope():
        monkeypatch.setattr(inspect, "stack", pytest.fail)  # torch's own reads the whole stack
        assert _named_by(dynamic_rendezvous.get_method_name, depth) == expected
    if depth in (2, 10_000):
        assert expected == {2: "next_rendezvous", 10_000: "no_method_name"}[depth]


def test_a_forked_process_removes_its_own_temporary_folders_not_its_parents():
    parents = tempfile.TemporaryDirectory(prefix="lockstep-test-parent-")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as a forked rank starts and ends
        disown_temporary_folders()
        own = tempfile.TemporaryDirectory(prefix="lockstep-test-child-")
        os.write(write, own.name.encode())
        remove_temporary_folders()
        os._exit(0)
    os.close(write)
    childs = os.read(read, 4096).decode()
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    assert childs and not os.path.exists(childs)
    assert os.path.isdir(parents.name)
    parents.cleanup()
