"""`lockstep ds-config FILE --world-size N` and the generated DeepSpeed configs."""

import json

from lockstep.cli import main
from lockstep.train.config import load_config
from lockstep.train.deepspeed_config import generate, problems
from lockstep.train.engine_table import zero_stages

SEED_ZERO3 = {  # the shape of seed 001, including its offload_gradients mistake
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "offload_gradients": {"device": "cpu"},
        "reduce_bucket_size": "auto",
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "fp16": {"enabled": True, "loss_scale": 0},
    "bf16": {"enabled": True},
}


def check(tmp_path, capsys, config, world_size):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    code = main(["ds-config", str(path), "--world-size", str(world_size)])
    return code, capsys.readouterr().out.strip().splitlines()


def test_seed_config_problems_one_line_each(tmp_path, capsys):
    code, lines = check(tmp_path, capsys, SEED_ZERO3, world_size=2)
    assert code == 1
    text = "\n".join(lines)
    assert "zero_optimization.offload_gradients" in text
    assert "train_batch_size=32 differs" in text and "4×2×2 = 16" in text
    assert "fp16.enabled and bf16.enabled are both true" in text
    assert "'zero_optimization.reduce_bucket_size' is \"auto\"" in text
    assert len(lines) == 4


def test_offload_param_ignored_below_stage3(tmp_path, capsys):
    config = {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    code, lines = check(tmp_path, capsys, config, world_size=1)
    assert code == 1 and lines == [
        f"{tmp_path / 'ds_config.json'}: zero_optimization.offload_param is ignored at stage 2: parameter offload needs stage 3"
    ]


def test_good_config_passes(tmp_path, capsys):
    config = {**SEED_ZERO3, "train_batch_size": 16}
    config["zero_optimization"] = {
        k: v for k, v in SEED_ZERO3["zero_optimization"].items() if k != "offload_gradients"
    } | {"reduce_bucket_size": 4096}
    config.pop("bf16")
    code, lines = check(tmp_path, capsys, config, world_size=2)
    assert code == 0, lines


def test_generated_configs_resolve_every_auto():
    for engine, stage in zero_stages().items():
        cfg = load_config(
            "smoke/gpu-zero3.toml" if engine == "zero3" else "smoke/cpu-zero2.toml",
            [f"engine.name={engine}"],
        )
        from lockstep.train.model import build_model

        ds = generate(cfg, 2, "cuda", build_model(cfg.model, 0))
        assert problems(ds, 2) == [], (engine, problems(ds, 2))
        assert ds["zero_optimization"]["stage"] == stage


def test_an_arch_suffix_deepspeed_cannot_build_for_is_named_with_the_fix():
    """A lent H200's image sets TORCH_CUDA_ARCH_LIST=9.0a; DeepSpeed 0.19.8's op builder then
    ends every ZeRO engine in `ValueError: invalid literal for int() ... '0a'`. The ZeRO engine
    refuses it on a GPU first, in one line that says what to set."""
    from lockstep.train.deepspeed_config import arch_list_problem

    assert arch_list_problem(None) is None
    assert arch_list_problem("9.0") is None
    assert arch_list_problem("8.0 8.6+PTX;9.0") is None
    said = arch_list_problem("9.0a")
    assert said == (
        "TORCH_CUDA_ARCH_LIST='9.0a': DeepSpeed cannot build its CUDA ops for '9.0a' "
        "(an arch suffix); run with TORCH_CUDA_ARCH_LIST='9.0'"
    )
    assert arch_list_problem("9.0;10.0a").endswith("TORCH_CUDA_ARCH_LIST='9.0;10.0'")
