"""Where two runs part (`lockstep.checks.divergence`): the pure comparison and verdict, and
planted divergences on the reference job (CPU/gloo, 2 ranks), each named at its module and
pass; clean runs name no module."""

import os
from unittest import mock

import pytest
import torch

from lockstep.checks import divergence as dv
from lockstep.checks.determinism import check_determinism
from lockstep.checks.equivalence import check_equivalence
from lockstep.checks.resume import check_resume
from lockstep.checks.world_size import check_world_size
from lockstep.module_digest import StepRecord, digest
from lockstep.train.config import from_dict
from support.configs import QUIET

BASE = {
    "device": "cpu",
    "steps": 2,
    "optimizer": {"lr": 1e-2, "warmup_steps": 1},
    "batch": {"micro_size": 4, "grad_accum": 1},
    **QUIET,
}


def config(engine="ddp", **fields):
    return from_dict({**BASE, **fields, "engine": {"name": engine}})


# ------------------------------------------------------------------------------------ pure


def _rec(step, forward=(), backward=(), update=()):
    return StepRecord(step, list(forward), list(backward), list(update))


def test_first_difference_names_step_pass_and_module():
    x, y = torch.ones(4), torch.tensor([1.0, 1.0, 1.0, 1.0 + 1e-6])
    a = [
        _rec(1, [("l0#0", digest(x))]),
        _rec(2, [("l0#0", digest(x))], [("w", digest(x))]),
    ]
    b = [
        _rec(1, [("l0#0", digest(x))]),
        _rec(2, [("l0#0", digest(x))], [("w", digest(y))]),
    ]
    found = dv.first_difference(a, b)
    assert (found.step, found.pass_, found.name) == (2, "backward", "w")
    assert dv.first_difference(a, b, rtol=1e-5) is None  # within tolerance
    assert dv.first_difference(a, a) is None
    assert "rtol" not in found.describe() and "bitwise" in found.describe()


def test_common_factor_and_verdicts():
    g = [("a", digest(torch.randn(10))), ("b", digest(torch.randn(3, 3)))]
    doubled = [(n, d.scaled(2.0)) for n, d in g]
    assert dv.common_factor(g, doubled) == pytest.approx(2.0)
    one_off = [g[0], (g[1][0], digest(torch.randn(3, 3)))]
    assert dv.common_factor(g, one_off) is None
    v = dv.float64_verdict("grad_norm", (1.0, 1.00003), (1.0, 1.0 + 1e-14))
    assert v.kind == "noise", v.text
    v = dv.float64_verdict("grad_norm", (1.0, 1.01), (1.0, 1.01))
    assert v.kind == "dependence", v.text
    v = dv.float64_verdict("loss", (1.0, 2.0), (1.0, 2.0), (g, doubled))
    assert v.kind == "factor" and "2 times" in v.text


# -------------------------------------------------------------------- planted, 2 ranks


pytestmark_dist = pytest.mark.distributed(world_size=2)


@pytestmark_dist
def test_unseeded_dropout_named_in_forward(tmp_path):
    from lockstep.train import trainer

    build = trainer.build_model

    def with_dropout(cfg, seed):
        model = build(cfg, seed)
        gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))

        def drop(module, args, out):
            keep = torch.rand(out[0].shape, generator=gen) > 0.1
            return (out[0] * keep / 0.9, *out[1:])

        model.transformer.h[1].attn.register_forward_hook(drop)
        return model

    with mock.patch.object(trainer, "build_model", with_dropout):
        result = check_determinism(config(), tmp_path)
    assert not result.passed
    part = result.forensics["parting"]
    assert (part["step"], part["phase"], part["module"]) == (1, "forward", "transformer.h.1.attn")


@pytestmark_dist
def test_equivalence_names_layernorm_epsilon_and_grad_hook(tmp_path):
    """FSDP with another LayerNorm epsilon (forward), then DDP with a gradient hook that
    scales one parameter (backward)."""
    from lockstep.train.engines import native

    loss = native.causal_lm_loss

    def eps_on_fsdp(model, batch):
        if hasattr(model, "reshard"):
            model.transformer.h[0].ln_2.eps = 1e-2
        return loss(model, batch)

    with mock.patch.object(native, "causal_lm_loss", eps_on_fsdp):
        result = check_equivalence(config(), tmp_path / "eps", engines=("ddp", "fsdp"))
    assert not result.passed, result.summary
    part = result.forensics["parting"]
    assert (part["step"], part["phase"], part["module"]) == (1, "forward", "transformer.h.0.ln_2")
    assert result.forensics["verdict"]["kind"] == "dependence", result.forensics

    planted = set()

    def hook_on_ddp(model, batch):
        if not hasattr(model, "reshard") and id(model) not in planted:
            planted.add(id(model))
            model.module.transformer.h[1].mlp.c_fc.weight.register_hook(lambda g: g * 1.5)
        return loss(model, batch)

    with mock.patch.object(native, "causal_lm_loss", hook_on_ddp):
        result = check_equivalence(config(), tmp_path / "hook", engines=("ddp", "fsdp"))
    assert not result.passed, result.summary
    part = result.forensics["parting"]
    assert (part["step"], part["phase"], part["name"]) == (
        1,
        "backward",
        "transformer.h.1.mlp.c_fc.weight",
    ), result.notes


@pytestmark_dist
def test_world_size_names_a_loss_normalisation_as_one_factor(tmp_path):
    from lockstep.train.engines import native

    loss = native.causal_lm_loss
    with mock.patch.object(native, "causal_lm_loss", lambda m, b: loss(m, b) * 2):
        result = check_world_size(config(), tmp_path)
    assert not result.passed
    verdict = result.forensics["verdict"]
    assert verdict["kind"] == "factor" and verdict["factor"] == pytest.approx(2.0), verdict
    assert "normalisation" in result.diagnosis


@pytestmark_dist
def test_clean_runs_name_nothing(tmp_path):
    for check in (check_determinism, check_world_size):
        result = check(config(), tmp_path / check.__name__)
        assert result.passed and result.forensics is None, result.summary


@pytestmark_dist
def test_resume_that_loses_a_buffer_named_at_its_module(tmp_path):
    """A module with a running buffer (persistent, in the checkpoint) that the resume does not
    restore: the loaded parameters, optimizer, schedule, RNG and data all match, the next step's
    output of that module does not."""
    from lockstep.train import trainer
    from lockstep.train.engines.native import NativeEngine

    build, load = trainer.build_model, NativeEngine.load

    def with_buffer(cfg, seed):
        model = build(cfg, seed)
        mlp = model.transformer.h[1].mlp
        mlp.register_buffer("running", torch.zeros(()))

        def shift(module, args, out):
            with torch.no_grad():
                module.running += 1
            return out + 0.01 * module.running

        mlp.register_forward_hook(shift)
        return model

    def forgetful(self, path, saved_world_size):
        client = load(self, path, saved_world_size)
        self.module.transformer.h[1].mlp.running.zero_()
        return client

    cfg = from_dict({**BASE, "steps": 4, "engine": {"name": "ddp"}})
    with (
        mock.patch.object(trainer, "build_model", with_buffer),
        mock.patch.object(NativeEngine, "load", forgetful),
    ):
        result = check_resume(cfg, tmp_path)
    assert not result.passed
    part = result.forensics["parting"]
    assert (part["step"], part["phase"], part["module"]) == (3, "forward", "transformer.h.1.mlp")


def test_markdown_and_json_keep_the_findings():
    from lockstep.checks.result import CheckResult

    part = dv.Parting(
        3, "forward", "h.1.mlp#0", digest(torch.ones(2)), digest(torch.zeros(2)), 0, 0
    )
    forensics = {"parting": part.to_dict(), "verdict": None, "reproduced": True, "lines": []}
    failed = CheckResult("resume", False, "x", forensics=forensics)
    text = dv.markdown([failed, CheckResult("determinism", True, "ok")])
    assert "| resume | FAIL | 3 | forward | h.1.mlp#0 |" in text and "determinism" not in text
    assert failed.to_dict()["forensics"]["parting"]["module"] == "h.1.mlp"
    assert dv.markdown([CheckResult("determinism", True, "ok")]) == ""


def test_a_loss_kept_in_float32_is_judged_by_the_norm():
    """The engines log the loss in float32 whatever the replay: one ulp apart in both fp32
    and the replay, with the gradient norm's float64 replay agreeing, is noise."""
    import struct

    f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]  # noqa: E731
    loss_a, loss_b = f32(4.6948285), f32(4.6948280)
    rows32 = ({"loss": loss_a, "grad_norm": 1.25}, {"loss": loss_b, "grad_norm": 1.2500001})
    rows64 = ({"loss": loss_a, "grad_norm": 1.3 + 1e-16}, {"loss": loss_b, "grad_norm": 1.3})
    assert dv.judge("loss", rows32, rows64).kind == "noise"
    far = ({"loss": 4.0, "grad_norm": 1.25}, {"loss": 4.5, "grad_norm": 1.2500001})
    assert (
        dv.judge(
            "loss", far, ({"loss": 4.0, "grad_norm": 1.3}, {"loss": 4.5, "grad_norm": 1.3})
        ).kind
        == "dependence"
    )
