"""What moves an fp32 run on a GPU: the noise floor's perturbations measured one by one.

    python benchmarks/gpu_noise_floor.py [--steps 8] [--out DIR]

On a CPU the intra-op thread count and ATen's vector width reorder a run's sums; on a GPU
neither moves a kernel. This measures, on one GPU, how far each perturbation moves the
reference job (ddp and fsdp, fp32, in-process as a check's own ranks run it) and a user's
script (examples/train_hf_trainer.py on the GPU, through lockstep's script runner, in a new
interpreter and in a forked rank): a plain rerun (must be 0: bitwise), the thread count, each
BLAS library, `noise_floor.reordered()` as the checks use it, and each of
`noise_floor.PERTURBATIONS`. Prints the largest relative difference per metric.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import torch

from lockstep.checks import noise_floor as nf
from lockstep.checks.divergence_replay import trainer_side
from lockstep.checks.script_runs import ScriptRunner
from lockstep.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def largest(base: list[dict], other: list[dict]) -> str:
    floor = nf.measure(base, [other])
    per = {m: max(v.values(), default=0.0) for m, v in floor.steps.items()}
    return "  ".join(f"{m} {per.get(m, 0.0):.3g}" for m in nf.METRICS)


@contextlib.contextmanager
def threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def blas(library: str):
    old = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(old)


def harness(engine: str, steps: int, out: Path) -> None:
    cfg = load_config(ROOT / "smoke" / f"gpu-{engine}.toml",
                      [f"steps={steps}", 'precision="fp32"', 'logging.wandb="disabled"',
                       "logging.progress=false"])  # fmt: skip
    side = trainer_side(cfg)
    _, base = side(steps, None, out / f"{engine}-base")
    cases = {
        "rerun": contextlib.nullcontext(),
        f"threads {nf.other_thread_count()}": threads(nf.other_thread_count()),
        "blas cublas": blas("cublas"),
        "blas cublaslt": blas("cublaslt"),
        "reordered()": nf.reordered(),
    }
    print(f"harness {engine} fp32, {steps} steps, default BLAS "
          f"{torch.backends.cuda.preferred_blas_library()}", flush=True)  # fmt: skip
    for name, ctx in cases.items():
        with ctx:
            _, rows = side(steps, None, out / f"{engine}-{name.replace(' ', '-')}")
        print(f"  {name:<18} {largest(base, rows)}", flush=True)


def script(steps: int, out: Path, forked: bool) -> None:
    source = (ROOT / "examples" / "train_hf_trainer.py").read_text()
    assert source.count("use_cpu=True") == 1, "the example changed"
    path = out / "train_hf_gpu.py"
    path.write_text(source.replace("use_cpu=True", "use_cpu=False"))
    runner = ScriptRunner(str(path), out / ("forked" if forked else "fresh"), timeout=300,
                          run_path=forked)  # fmt: skip
    base = runner.run("base", nproc=1, max_steps=steps)
    cases = {"rerun": {}, "CUBLAS_WORKSPACE_CONFIG=:0:0": {"CUBLAS_WORKSPACE_CONFIG": ":0:0"},
             "TORCH_BLAS_PREFER_CUBLASLT=1": {"TORCH_BLAS_PREFER_CUBLASLT": "1"}}  # fmt: skip
    cases |= {f"PERTURBATIONS[{i}]": env for i, env in enumerate(nf.PERTURBATIONS)}
    print(
        f"script train_hf_trainer.py on the GPU, {steps} steps, "
        f"{'forked rank (--run-path)' if forked else 'new interpreter'}",
        flush=True,
    )
    for i, (name, env) in enumerate(cases.items()):
        rows = runner.run(f"case-{i}", nproc=1, max_steps=steps, reuse=False, perturb=env)
        print(f"  {name:<30} {largest(base, rows)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--parts", default="harness,script")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_noise_floor: needs a GPU")
    out = args.out or Path(tempfile.mkdtemp(prefix="lockstep-floor-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    parts = args.parts.split(",")
    if "script" in parts:  # before any CUDA use in this process: the runner launches ranks
        script(args.steps, out, forked=False)
        script(args.steps, out, forked=True)
    if "harness" in parts:
        for engine in ("ddp", "fsdp"):
            harness(engine, args.steps, out)


if __name__ == "__main__":
    main()
