"""The engine table (`lockstep.train.engine_table.ENGINES`): the built-in rows, and a new
engine as one file, this one. It defines an engine (DDP under another name), registers its row,
and lockstep derives the rest: the config accepts the name and the options it claims, the clip
norm rule, checkpoint compatibility with ddp and fsdp, the modules a launcher preloads, the
extras it needs; a run builds and trains it, the equivalence check holds it to ddp, and ddp
resumes its checkpoint. No other file names it."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from lockstep.errors import UsageError
from lockstep.train import engine_table as table
from lockstep.train.checkpoint import check_compatible
from lockstep.train.config import config_needs, from_dict
from lockstep.train.engine_table import ENGINES, EngineSpec, engine_modules, register
from lockstep.train.engines.ddp import DDPEngine
from support.configs import QUIET
from support.tiny import TINY


class ToyEngine(DDPEngine):
    name = "toy"


TOY = EngineSpec(
    "toy",
    f"{__name__}:ToyEngine",
    checkpoint="dcp",  # DDP's: it resumes ddp and fsdp checkpoints and they resume its own
    options=("find_unused_parameters",),
    norm_types=(2.0,),
    norm_note="toy clips by the L2 norm only",
)


@pytest.fixture
def toy():
    spec = register(TOY)
    try:
        yield spec
    finally:
        del ENGINES["toy"]


def config(name: str, **sections):
    return from_dict(
        {"device": "cpu", "steps": 2, **QUIET, **TINY, "engine": {"name": name}, **sections}
    )


def usage_error(cfg) -> str:
    with pytest.raises(UsageError) as caught:
        cfg.check(2)
    return str(caught.value)


def test_builtin_rows():
    """The table as lockstep ships it: what the config, checkpoints and DeepSpeed derive."""
    assert list(ENGINES) == ["ddp", "fsdp", "zero1", "zero2", "zero3"]
    assert table.zero_stages() == {"zero1": 1, "zero2": 2, "zero3": 3}
    assert table.shared_checkpoints() == [("ddp", "fsdp")]
    assert table.norm_types() == (2.0, math.inf)
    assert table.engines_clipping_by(math.inf) == ("ddp", "fsdp")
    assert {o: table.engines_with(o) for o in table.engine_options()} == {
        "find_unused_parameters": ("ddp",),
        "bucket_cap_mb": ("ddp",),
        "reshard_after_forward": ("fsdp",),
        "cpu_offload": ("fsdp",),
        "offload_optimizer": ("zero1", "zero2", "zero3"),
        "ds_config": ("zero1", "zero2", "zero3"),
        "offload_params": ("zero3",),
    }
    assert engine_modules("ddp") == ["lockstep.train.engines.ddp"]
    assert engine_modules("zero2") == [
        "lockstep.train.engines.zero",
        "deepspeed",
        "deepspeed.runtime.zero.muon.muon_optimizer",  # what deepspeed.initialize imports
    ]
    for name, spec in ENGINES.items():
        assert spec.engine_class().__module__ == spec.module, name
    with pytest.raises(ValueError, match="'ddp' is already registered"):
        register(ENGINES["ddp"])


def test_a_registered_engine_is_a_config_name(toy):
    assert config("toy").engine.name == "toy"
    with pytest.raises(UsageError) as caught:
        config("toy2")
    assert str(caught.value) == (
        "config: engine.name: Input should be 'ddp', 'fsdp', 'zero1', 'zero2', 'zero3' or 'toy'"
    )
    config("toy", engine={"name": "toy", "find_unused_parameters": True}).check(2)
    assert usage_error(config("toy", engine={"name": "toy", "bucket_cap_mb": 5})) == (
        "engine.bucket_cap_mb applies to engine ddp, not 'toy'; remove it"
    )
    zero3 = config("zero3", engine={"name": "zero3", "find_unused_parameters": True})
    assert "applies to engine ddp, toy, not 'zero3'" in usage_error(zero3)
    assert usage_error(config("toy", clip={"norm_type": math.inf})) == (
        "clip.norm_type=inf is not supported by engine 'toy' (toy clips by the L2 norm only); "
        "use norm_type 2, or engine ddp or fsdp"
    )


def test_a_registered_engine_is_gone_once_removed(toy):
    del ENGINES["toy"]
    try:
        with pytest.raises(UsageError, match=r"engine\.name: Input should be 'ddp', 'fsdp'"):
            config("toy")
    finally:
        ENGINES["toy"] = toy


def test_checkpoint_compatibility_follows_the_format(tmp_path, toy):
    for saved, engine in [("ddp", "toy"), ("toy", "fsdp"), ("toy", "toy")]:
        check_compatible({"engine": saved, "world_size": 2}, tmp_path, engine)
    with pytest.raises(UsageError) as caught:
        check_compatible({"engine": "zero2", "world_size": 2}, tmp_path, "toy")
    assert str(caught.value) == (
        f"checkpoint {tmp_path} was written by engine 'zero2', this run uses 'toy'; resume with "
        "the same engine (ddp, fsdp and toy can load each other's)"
    )
    with pytest.raises(UsageError, match="written by engine 'elsewhere', this run uses 'toy'"):
        check_compatible({"engine": "elsewhere", "world_size": 2}, tmp_path, "toy")


def test_the_table_imports_nothing_of_train_nor_torch():
    """The run config reads the table in the launching process, and the engines' interface
    imports the run config: the table stands below both (no import circle)."""
    code = (
        "import sys, lockstep.train.engine_table; "
        "print(sorted(m for m in sys.modules if m.startswith(('lockstep.train.', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['lockstep.train.engine_table']"


def test_the_engines_package_re_exports_the_table():
    from lockstep.train import engines

    assert engines.ENGINES is ENGINES and engines.register is register
    assert engines.EngineSpec is EngineSpec and engines.zero_stages is table.zero_stages


def test_launcher_modules_and_extras(toy):
    assert engine_modules("toy") == [__name__]
    assert "deepspeed" not in config_needs(config("toy"))
    assert config_needs(config("zero1"))["deepspeed"] == "engine zero1"


def test_it_trains_matches_ddp_and_ddp_resumes_it(tmp_path, toy):
    from lockstep.checks import clip, equivalence
    from lockstep.train.trainer import run_training

    cfg = config("toy")
    result = equivalence.check_equivalence(cfg, tmp_path / "eq", engines=("ddp", "toy"))
    assert result.passed and result.summary.startswith("ddp, toy agree over 2 steps"), result
    assert clip.ENGINES["toy"].norm_types == (2.0,)  # check_clip_norm_types: 2 only

    ckpt = tmp_path / "ckpt"
    written = run_training(config("toy", checkpoint={"dir": str(ckpt)}), tmp_path / "toy")
    assert [s.step for s in written.steps] == [1, 2]
    resumed = run_training(config("ddp", steps=3, checkpoint={"dir": str(ckpt)}), tmp_path / "ddp")
    assert [s.step for s in resumed.steps] == [3]
