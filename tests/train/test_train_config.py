"""Run config validation: bad configs exit 2 with one line, in the parent, before any rank."""

from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.errors import UsageError
from lockstep.train.config import derive, load_config
from lockstep.train.engine_table import ENGINES

SMOKE = Path(__file__).resolve().parents[2] / "smoke"


def train_error(capsys, *args: str) -> str:
    code = main(["train", str(SMOKE / "cpu-ddp.toml"), "--nproc", "2", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lockstep: error: "), err
    return lines[0]


def test_unknown_engine(capsys):
    line = train_error(capsys, "--set", "engine.name=zero4")
    assert "engine.name" in line and "zero4" not in line.split(":", 2)[1]


def test_batch_not_divisible_by_world_size(capsys):
    line = train_error(capsys, "--set", "batch.global_size=6", "--set", "batch.grad_accum=0")
    assert "batch.global_size=6" in line and "4×2" in line


def test_zero3_with_ddp_only_option(capsys):
    line = train_error(
        capsys, "--set", "engine.name=zero3", "--set", "engine.find_unused_parameters=true"
    )
    assert "engine.find_unused_parameters" in line and "zero3" in line


def test_missing_model_factory(capsys):
    line = train_error(capsys, "--set", "model.factory=no_such_module:build")
    assert "model.factory" in line and "no_such_module" in line


def test_unknown_key_is_named(capsys):
    line = train_error(capsys, "--set", "optimizer.learning_rate=1")
    assert "unknown key 'optimizer.learning_rate'" in line


def test_inf_norm_rejected_for_zero(capsys):
    line = train_error(capsys, "--set", "engine.name=zero2", "--set", "clip.norm_type=inf")
    assert "clip.norm_type=inf" in line


def test_missing_config_file(capsys):
    assert main(["train", "no/such.toml"]) == 2
    assert "config file not found: no/such.toml" in capsys.readouterr().err


def test_set_overrides_parse_toml_values():
    cfg = load_config(
        SMOKE / "cpu-zero3.toml",
        ["steps=3", "optimizer.betas=[0.8, 0.9]", "clip.norm_type=inf", "logging.run_name=abc"],
    )
    assert cfg.steps == 3 and cfg.optimizer.betas == (0.8, 0.9)
    assert cfg.clip.norm_type == float("inf") and cfg.logging.run_name == "abc"


def test_derive_sets_values_as_set_does():
    """`derive` (code) and `--set` (text) are one mechanism: the same keys, the same errors."""
    cfg = load_config(SMOKE / "cpu-ddp.toml")
    got = derive(cfg, engine__name="fsdp", **{"logging.run_name": "abc"}, steps=3)
    assert (got.engine.name, got.logging.run_name, got.steps) == ("fsdp", "abc", 3)
    assert cfg.engine.name == "ddp"  # a copy
    assert got == load_config(
        SMOKE / "cpu-ddp.toml", ['engine.name="fsdp"', 'logging.run_name="abc"', "steps=3"]
    )
    with pytest.raises(UsageError, match="'steps' is a value, not a section"):
        derive(cfg, steps__every=2)
    with pytest.raises(UsageError, match=r"^check: unknown key 'clip.norm'"):
        derive(cfg, "check", clip__norm=2)


def test_batch_shape_derives_accumulation():
    cfg = load_config(SMOKE / "cpu-ddp.toml", ["batch.global_size=32", "batch.grad_accum=0"])
    assert cfg.batch_shape(2) == (4, 4, 32)
    with pytest.raises(UsageError, match="disagrees"):
        load_config(SMOKE / "cpu-ddp.toml", ["batch.global_size=32"]).batch_shape(2)


@pytest.mark.parametrize("engine", ENGINES)  # every engine of the table ships both
def test_shipped_configs_are_valid(engine):
    for tier in ("cpu", "gpu"):
        cfg = load_config(SMOKE / f"{tier}-{engine}.toml")
        assert cfg.engine.name == engine
        if tier == "cpu":
            cfg.check(2)


def test_half_set_launcher_variables(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["train", str(SMOKE / "cpu-ddp.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "half-set: RANK set but WORLD_SIZE missing" in err


def test_a_timeout_under_a_launcher_is_refused(capsys, monkeypatch):
    """--timeout bounds the local ranks `--nproc` starts; under torchrun (here one rank of
    it) another value than its default is one line, exit 2 (the default is no request:
    tests/env/test_env_launcher.py trains under launchers without it)."""
    launch = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    for name, value in {**launch, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t")
    assert main(["train", str(SMOKE / "cpu-ddp.toml"), "--timeout", "60"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "lockstep: error: --timeout is for --nproc local ranks; torchelastic started this one"
    )


def test_checkpoint_without_manifest_is_incomplete(tmp_path):
    from lockstep.train import checkpoint

    (tmp_path / "step_00000004" / "dcp").mkdir(parents=True)
    with pytest.raises(UsageError, match="step_00000004 is incomplete or corrupt: no readable"):
        checkpoint.verify(tmp_path / "step_00000004")
    with pytest.raises(UsageError, match="holds step_00000004 but no 'latest' pointer"):
        checkpoint.find(tmp_path, "auto")
    assert checkpoint.find(tmp_path, "never") is None


def test_checkpoint_engine_compatibility(tmp_path):
    from lockstep.train.checkpoint import check_compatible

    written = {"engine": "zero2", "world_size": 2}
    check_compatible(written, tmp_path, "zero2")
    check_compatible({"engine": "fsdp", "world_size": 2}, tmp_path, "ddp")  # both DCP
    with pytest.raises(UsageError, match="written by engine 'zero2', this run uses 'fsdp'"):
        check_compatible(written, tmp_path, "fsdp")
    with pytest.raises(UsageError, match="written by engine 'zero2', this run uses 'zero3'"):
        check_compatible(written, tmp_path, "zero3")


def test_universal_conversion_failure_is_one_line(tmp_path):
    """DeepSpeed's converter on a checkpoint without ZeRO files: a UsageError that says what to
    do, and nothing half-written left where a later resume would find it."""
    from lockstep.train.engines.zero import universal_checkpoint

    (tmp_path / "deepspeed" / "state").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"ds_to_universal failed .*resume on the world size") as e:
        universal_checkpoint(tmp_path)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "universal").exists()
