"""Harness overhead and tokens/s per engine, side by side in one run.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 \
        benchmarks/bench_harness.py [--engines ddp,fsdp,zero1,zero2,zero3] [--rounds 10] \
        [--pair harness-minimal|harness-harness|minimal-minimal]

For each engine it builds the harness (`Trainer`, writing metrics.jsonl and an offline wandb
run) and a minimal hand-written loop on the same model, batch, data and engine (forward,
backward with accumulation, clip, step, schedule, `loss.item()`), then alternates blocks of
steps between the two so that load from other processes hits both alike. Prints the median
step time of each, their ratio (goal: at most 3%), tokens/s, and the cost of the harness's own
per-step bookkeeping (loss all-reduce, memory probe, JSONL line, wandb log) timed alone: on
a shared, loaded machine the A/B ratio is noisy, the bookkeeping share is not. `--pair
harness-harness` and `--pair minimal-minimal` put the same loop in both slots: what they print
as overhead is the method's own bias, the floor below which an A/B figure means nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lockstep.train.config import from_dict
from lockstep.train.data import build_stream
from lockstep.train.engines.base import lr_lambda
from lockstep.train.metrics import StepMetrics, memory
from lockstep.train.model import block_modules, build_model, causal_lm_loss, vocab_size
from lockstep.train.trainer import Trainer


def bench_config(args, engine: str, device: str) -> dict:
    return {
        "device": device,
        "precision": args.precision or ("bf16" if device == "cuda" else "fp32"),
        "steps": 10_000,
        "model": {"preset": args.preset},
        "data": {"seq_len": args.seq_len},
        "engine": {"name": engine},
        "batch": {"micro_size": args.micro, "grad_accum": 2},
        "clip": {"max_norm": 1.0},
        "checkpoint": {"at_end": False, "resume": "never"},
        "logging": {"wandb": args.wandb, "progress": False},
    }


class MinimalLoop:
    """What a user would write by hand for the same engine: no metrics, no checkpoints."""

    def __init__(self, cfg, device: torch.device):
        self.cfg, self.device = cfg, device
        model = build_model(cfg.model, cfg.seed)
        self.n_params = sum(p.numel() for p in model.parameters())
        world, rank = dist.get_world_size(), dist.get_rank()
        micro, accum, _ = cfg.batch_shape(world)
        self.stream = build_stream(cfg.data, cfg.seed, vocab_size(model), rank, world, micro, accum)
        o, name = cfg.optimizer, cfg.engine.name
        if name.startswith("zero"):
            import deepspeed

            from lockstep.train.deepspeed_config import generate

            self.ds, _, _, _ = deepspeed.initialize(
                model=model,
                model_parameters=model.parameters(),
                lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(
                    opt, lr_lambda(o, cfg.steps)
                ),
                config=generate(cfg, world, device.type, model),
                dist_init_required=False,
            )
            return
        self.ds = None
        amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self.autocast = contextlib.nullcontext
        if name == "ddp":
            self.model = torch.nn.parallel.DistributedDataParallel(model.to(device))
            self.no_sync = self.model.no_sync
            if amp is not None:  # as torch's AMP recipe: autocast around the forward
                self.autocast = lambda: torch.autocast(device.type, dtype=amp)
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = {} if amp is None else {"mp_policy": MixedPrecisionPolicy(amp, torch.float32)}
            for block in block_modules(model):
                fully_shard(block, **mp)
            self.model = fully_shard(model, **mp)
            self.no_sync = None
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(o, cfg.steps))

    def step(self) -> float:
        batches = self.stream.micro_batches()
        if self.ds is not None:
            for batch in batches:
                loss = causal_lm_loss(self.ds, batch.to(self.device))
                self.ds.backward(loss)
                self.ds.step()
            return loss.item()
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            if self.no_sync is None:
                self.model.set_requires_gradient_sync(last)
            ctx = contextlib.nullcontext() if last or self.no_sync is None else self.no_sync()
            with ctx:
                with self.autocast():
                    loss = causal_lm_loss(self.model, batch.to(self.device)) / len(batches)
                loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip.max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        return loss.item()


def bookkeeping_step(trainer: Trainer, sink) -> None:
    """What the harness adds to a step: the loss all-reduce, memory probe, JSONL and wandb."""
    loss = torch.zeros((), device=trainer.ctx.device)
    dist.all_reduce(loss)
    float(loss)
    memory(trainer.ctx.device)
    sink.log(trainer_metrics_stub(trainer))


def trainer_metrics_stub(trainer: Trainer) -> StepMetrics:
    return StepMetrics(trainer.step, 1.0, 1.0, 1.0, 1e-3, 1, 1.0, 1.0, 0, "cpu_rss", None, False)


def timed(step, n: int) -> list[float]:
    times = []
    for _ in range(n):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


class HarnessLoop:
    """lockstep's `Trainer` with its rank-0 metrics sink: one `step()` is one logged step."""

    def __init__(self, cfg, out: Path):
        self.trainer = Trainer(cfg, out)
        self.sink = self.trainer.open_metrics(0, cfg.steps)

    def step(self) -> None:
        self.sink.log(self.trainer.train_step())

    def close(self) -> None:
        self.sink.close()
        self.trainer.close()


def bench_engine(engine: str, device: torch.device, args, out: Path) -> dict:
    cfg = from_dict(bench_config(args, engine, device.type))
    harness = HarnessLoop(cfg, out / engine)
    minimal = MinimalLoop(cfg, device)
    a, b = harness, minimal
    if args.pair == "harness-harness":  # A/A: a second harness in the minimal loop's slot
        b = HarnessLoop(cfg, out / f"{engine}-b")
    elif args.pair == "minimal-minimal":  # A/A: a second minimal loop in the harness's slot
        a = MinimalLoop(cfg, device)
    timed(a.step, 2), timed(b.step, 2)  # warm up both
    times_a, times_b = [], []
    for _ in range(args.rounds):
        times_a += timed(a.step, args.block)
        times_b += timed(b.step, args.block)
    bookkeeping = timed(lambda: bookkeeping_step(harness.trainer, harness.sink), 200)
    harness.close()
    if isinstance(b, HarnessLoop):
        b.close()
    tokens = harness.trainer.global_size * cfg.data.seq_len
    median_a, median_b = statistics.median(times_a), statistics.median(times_b)
    return {
        "engine": engine,
        "a_s": median_a,
        "b_s": median_b,
        "bookkeeping_s": statistics.median(bookkeeping),
        "tokens_per_s": tokens / median_a,
        "n_params": minimal.n_params,
    }


def print_row(r: dict, peak_tflops: float, world: int) -> None:
    overhead = r["a_s"] / r["b_s"] - 1
    share = r["bookkeeping_s"] / r["b_s"]
    print(
        f"{r['engine']:8} {r['a_s']:10.4f} {r['b_s']:10.4f} {overhead:+13.1%} "
        f"{r['bookkeeping_s'] * 1e3:15.2f} {share:10.1%} {r['tokens_per_s']:9.0f}"
    )
    if peak_tflops:  # 6 N FLOPs per token (no attention term), over all devices
        mfu = 6 * r["n_params"] * r["tokens_per_s"] / (peak_tflops * 1e12 * world)
        print(f"{'':8} MFU {mfu:.2%} ({r['n_params'] / 1e6:.1f} M parameters)")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="ddp,fsdp,zero1,zero2,zero3")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--preset", default="gpt2-tiny", help="or gpt2-small-bench (GPU)")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument(
        "--precision", choices=["fp32", "bf16"], help="default: bf16 on a GPU, fp32 on the CPU"
    )
    parser.add_argument("--wandb", default="offline", choices=["offline", "disabled"])
    parser.add_argument(
        "--pair",
        default="harness-minimal",
        choices=["harness-minimal", "harness-harness", "minimal-minimal"],
        help="what is compared; the two A/A pairs show the method's own bias",
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=0.0, help="per device, e.g. 989 (H100 bf16 dense)"
    )
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    rank0 = dist.get_rank() == 0
    if rank0:
        name = torch.cuda.get_device_name(device) if on_gpu else f"CPU ({os.cpu_count()} cores)"
        precision = args.precision or ("bf16" if on_gpu else "fp32")
        shape = f"{args.preset}, {precision}, seq {args.seq_len}, micro {args.micro} x accum 2"
        print(
            f"\n{name}, {dist.get_world_size()} ranks, {shape}, wandb {args.wandb}, "
            f"medians of {args.rounds * args.block} steps, A-B: {args.pair}"
        )
        print(
            f"{'engine':8} {'A s':>10} {'B s':>10} {'A/B overhead':>13} "
            f"{'bookkeeping ms':>15} {'its share':>10} {'tokens/s':>9}",
            flush=True,
        )
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            # each row as soon as it is measured: an engine that fails later loses no figure
            row = bench_engine(engine, device, args, Path(tmp))
            if rank0:
                print_row(row, args.peak_tflops, dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
