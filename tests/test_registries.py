"""`lockstep.registry`: rows by name in registration order, one duplicate policy, a one-line
error naming the known names, 'module:attr' references imported at their first use; and the
tables built on it (checks, engines, launchers, local checks, link measurements)."""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass

import pytest

from lockstep.errors import EXIT_USAGE, UsageError
from lockstep.registry import Ref, Registry, UnknownName


@dataclass(frozen=True)
class Row:
    name: str
    size: int = 0


def test_rows_keep_their_order_and_a_name_is_registered_once():
    table = Registry("widget", [Row("a"), Row("b")])
    assert table.names() == ("a", "b") and list(table) == ["a", "b"] and len(table) == 2
    assert table["a"] == Row("a") and "b" in table and "c" not in table
    assert table.register(Row("c")) == Row("c") and table.names() == ("a", "b", "c")

    with pytest.raises(ValueError) as caught:
        table.register(Row("a", 1))
    assert str(caught.value) == (
        "widget 'a' is already registered; register(..., replace=True) replaces it"
    )
    assert table["a"] == Row("a")
    table.register(Row("a", 1), replace=True)  # in its place, not at the end
    assert list(table.items()) == [("a", Row("a", 1)), ("b", Row("b")), ("c", Row("c"))]

    del table["b"]
    assert table.names() == ("a", "c") and table == {"a": Row("a", 1), "c": Row("c")}


def test_an_unknown_name_is_a_one_line_usage_error_naming_the_known_ones():
    table = Registry("widget", [Row("a"), Row("b")])
    with pytest.raises(UnknownName) as caught:
        table["z"]
    assert str(caught.value) == "unknown widget 'z'; known: a, b"
    assert isinstance(caught.value, UsageError) and caught.value.exit_code == EXIT_USAGE
    assert isinstance(caught.value, KeyError)  # what a dict raises
    assert table.get("z") is None and table.get("a") == Row("a")  # a dict's get
    with pytest.raises(UnknownName, match=r"^unknown widget 'z'; known: none$"):
        Registry("widget")["z"]


def test_a_reference_imports_its_module_at_first_use_and_pickles(tmp_path, monkeypatch):
    module = "lockstep_lazy_probe"
    (tmp_path / f"{module}.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        ref = Ref(f"{module}:double")
        assert ref.path == module
        assert module not in sys.modules
        assert ref(3) == 6 and module in sys.modules
        assert ref.resolve() is sys.modules[module].double
        assert pickle.loads(pickle.dumps(ref)) == ref
    finally:
        sys.modules.pop(module, None)


def test_a_checks_function_is_a_reference_named_by_its_module():
    from lockstep.checks import registry, resume

    call = registry.Function("resume", "check_resume")
    assert isinstance(call, Ref) and call.target == "lockstep.checks.resume:check_resume"
    assert (call.module, call.path) == ("resume", "lockstep.checks.resume")
    assert call.resolve() is resume.check_resume and registry.CHECKS["resume"].rank == call
    assert pickle.loads(pickle.dumps(call)) == call  # a launch sends it to its ranks


def test_every_table_is_a_registry_with_its_register_entry_point():
    from lockstep.checks.registry import CHECKS
    from lockstep.launch.detect import SCHEMES
    from lockstep.launch.script import LAUNCHERS
    from lockstep.preflight.links import measure
    from lockstep.preflight.local import registry as local
    from lockstep.train import engine_table

    assert CHECKS.names()[:2] == ("determinism", "resume")
    assert engine_table.ENGINES.names() == ("ddp", "fsdp", "zero1", "zero2", "zero3")
    assert LAUNCHERS.names() == ("torchrun", "deepspeed")
    assert LAUNCHERS["deepspeed"].needs == {"deepspeed": "its launcher"}
    assert SCHEMES.names()[0] == "torchelastic" and SCHEMES.names()[-1] == "manual"
    assert local.LOCAL_CHECKS.names()[0] == "gpu_assignment"
    assert measure.MEASUREMENTS.names() == ("latency", "bandwidth")
    for table, register in (
        (engine_table.ENGINES, engine_table.register),
        (local.LOCAL_CHECKS, local.register),
        (measure.MEASUREMENTS, measure.register),
    ):
        assert isinstance(table, Registry) and register.__self__ is table
    with pytest.raises(UnknownName, match=r"^unknown engine 'ddq'; known: ddp, fsdp, zero1"):
        engine_table.ENGINES["ddq"]


def test_an_unknown_launcher_is_named_with_the_known_ones():
    from lockstep.launch.script import Script

    with pytest.raises(UsageError) as caught:
        Script("python train.py", launcher="mpirun")
    assert str(caught.value) == "--launcher must be one of torchrun, deepspeed, got 'mpirun'"


def test_each_launcher_row_is_found_by_its_marker_first_row_first():
    """One row per launcher: its marker set with its variables is that launcher; rows are
    tried in order (torchrun inside a Slurm allocation is torchelastic)."""
    from lockstep.launch.detect import SCHEMES, detect

    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for scheme in SCHEMES.values():
        env = {scheme.marker: "run-1", scheme.rank: "1", scheme.world_size: "2", **rendezvous}
        env.update({v: "0" for v in (scheme.local_rank, scheme.node_rank) if v})  # deepspeed's
        env.update({scheme.local_world_size: "2"} if scheme.local_world_size else {})  # marker
        info = detect(env)
        assert (info.launcher, info.rank, info.world_size) == (scheme.name, 1, 2), scheme
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    torchrun = {"TORCHELASTIC_RUN_ID": "r", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    inside = detect({**slurm, **torchrun, "LOCAL_WORLD_SIZE": "2", **rendezvous})
    assert inside.launcher == "torchelastic" and inside.rank == 0
