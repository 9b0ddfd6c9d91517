"""The training loop every engine shares, usable in-process: `run_training(cfg, out_dir)`.
Design: docs/design/train.md."""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from lockstep.alerts import Evaluator
from lockstep.errors import UsageError
from lockstep.launch import detect, rank_environment
from lockstep.redact import redact_mapping
from lockstep.train import checkpoint
from lockstep.train.config import RunConfig
from lockstep.train.data import build_stream
from lockstep.train.engine_table import build_engine, engine_modules
from lockstep.train.engines.base import Context, Engine
from lockstep.train.group import init_launched_group
from lockstep.train.metrics import MetricsSink, NullSink, StepMetrics, memory, memory_total
from lockstep.train.model import build_model, model_modules, vocab_size

PG_TIMEOUT = timedelta(minutes=10)


@dataclass
class TrainResult:
    """What a run produced. `steps` holds the steps this call ran (after any resume)."""

    steps: list[StepMetrics]
    start_step: int
    final_step: int
    param_digest: str
    checkpoint: Path | None
    out_dir: Path
    params: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    optimizer_state: dict[str, dict[str, torch.Tensor]] | None = field(default=None, repr=False)
    stopped_by: str | None = None  # the "stop" alert rule that ended the run early

    def summary(self) -> str:
        """One line for the user: where the run ended and why."""
        if self.stopped_by:
            return (
                f"stopped at step {self.final_step} by alert {self.stopped_by}; checkpoint "
                f"{self.checkpoint}"
            )
        return f"trained to step {self.final_step}, parameter digest {self.param_digest[:16]}"


def parameter_digest(params: dict[str, torch.Tensor]) -> str:
    """sha256 over names, shapes and fp32 bytes, in name order: equal digests, equal weights."""
    h = hashlib.sha256()
    for name in sorted(params):
        t = params[name].detach().float().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}\0".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def join_process_group(device: str) -> bool:
    """Make sure a default process group exists; True when this call created it."""
    if dist.is_initialized():
        return False
    backend = "nccl" if device == "cuda" else "gloo"
    if detect.adopt() is not None:  # torchrun, srun, mpirun, ...: env:// from its variables
        init_launched_group(backend, PG_TIMEOUT)  # under torchrun: a namespace per attempt
    else:  # a single process
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=PG_TIMEOUT)
    return True


def seed_everything(seed: int, deterministic: bool, device: str) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        if device == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)


class Trainer:
    """One run on this rank. Construct on every rank; every method is collective."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path):
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        device = cfg.resolved_device()
        rank_environment(device)  # before DeepSpeed's accelerator probe
        self.owns_group = join_process_group(device)
        try:
            self._build(cfg, device)
        except BaseException:
            if self.owns_group:
                dist.destroy_process_group()
            raise

    def _build(self, cfg: RunConfig, device: str) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        cfg.check(self.world_size)
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if device == "cuda":
            torch.cuda.set_device(local_rank)
        micro, accum, self.global_size = cfg.batch_shape(self.world_size)
        self.ctx = Context(
            self.rank,
            self.world_size,
            local_rank,
            torch.device(device, local_rank) if device == "cuda" else torch.device("cpu"),
            micro,
            accum,
        )
        seed_everything(cfg.seed, cfg.deterministic, device)
        model = build_model(cfg.model, cfg.seed)
        self.stream = build_stream(
            cfg.data, cfg.seed, vocab_size(model), self.rank, self.world_size, micro, accum
        )
        self.engine: Engine = build_engine(cfg.engine.name, model, cfg, self.ctx)
        seed_everything(cfg.seed + self.rank, False, device)  # per-rank streams after init
        self.ckpt_root = (
            Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else self.out_dir / "checkpoints"
        )
        self.step = 0
        self.last_checkpoint: Path | None = None
        self.mem_total = memory_total(self.ctx.device)
        self.alert_rules = cfg.alerts.load()
        self.stopped_by: str | None = None
        self._resume()

    def _resume(self) -> None:
        path = checkpoint.find(self.ckpt_root, self.cfg.checkpoint.resume)
        if path is None:
            return
        client = checkpoint.load(self.engine, path)
        if client["data"]["global_size"] != self.global_size:
            raise UsageError(
                f"checkpoint {path} was written with a global batch of {client['data']['global_size']}"
                f", this run uses {self.global_size}; set batch.global_size to match"
            )
        self.step = int(client["step"])
        self.stream.load_state_dict(client["data"])
        self.last_checkpoint = path

    def save(self) -> Path:
        client = {
            "step": self.step,
            "data": self.stream.state_dict(),
            "world_size": self.world_size,
        }
        self.last_checkpoint = checkpoint.save(
            self.engine, self.ckpt_root, self.step, client, self.cfg.checkpoint.keep
        )
        return self.last_checkpoint

    def train_step(self) -> StepMetrics:
        start = time.perf_counter()
        outcome = self.engine.step(self.stream.micro_batches())
        loss = outcome.loss.clone()
        sync_start = time.perf_counter()
        dist.all_reduce(loss)  # every rank waits here for the slowest one
        loss_value = float(loss) / self.world_size
        end = time.perf_counter()
        elapsed, sync = end - start, end - sync_start
        self.step += 1
        tokens = self.global_size * self.cfg.data.seq_len
        mem, kind = memory(self.ctx.device)
        return StepMetrics(
            step=self.step,
            loss=loss_value,
            grad_norm=outcome.grad_norm,
            clip_coef=outcome.clip_coef,
            lr=outcome.lr,
            tokens=tokens,
            tokens_per_s=tokens / elapsed,
            step_time_s=elapsed,
            mem_bytes=mem,
            mem_kind=kind,
            loss_scale=outcome.loss_scale,
            skipped=outcome.skipped,
            mem_frac=mem / self.mem_total,
            sync_time_s=sync,
            time=time.time(),
        )

    def train(self, stop_at: int | None = None, capture_state: bool = False) -> TrainResult:
        """Train to `stop_at` (default cfg.steps; the LR schedule always spans cfg.steps)."""
        start = self.step
        end = min(stop_at or self.cfg.steps, self.cfg.steps)
        sink = self.open_metrics(start, end)
        rows = []
        every, at_end = self.cfg.checkpoint.every, self.cfg.checkpoint.at_end
        alerts = Evaluator(self.alert_rules) if self.rank == 0 else None
        may_stop = any(rule.action == "stop" for rule in self.alert_rules)
        try:
            while self.step < end:
                rows.append(self.train_step())
                sink.log(rows[-1])
                stop = None
                if alerts is not None:
                    for alert in alerts.feed(asdict(rows[-1])):
                        sink.alert(alert)
                        if alert.action == "stop" and stop is None:
                            stop = alert.rule
                if may_stop:
                    stop = self._agree_on_stop(stop)
                if stop is not None:
                    self.stopped_by = stop
                    self.save()  # a clean end, resumable
                    break
                if (every and self.step % every == 0) or (at_end and self.step == end):
                    self.save()
        finally:
            sink.close()
        params = self.engine.full_parameters()
        return TrainResult(
            steps=rows,
            start_step=start,
            final_step=self.step,
            param_digest=parameter_digest(params),
            checkpoint=self.last_checkpoint,
            out_dir=self.out_dir,
            params=params if capture_state else None,
            optimizer_state=self.engine.full_optimizer_state() if capture_state else None,
            stopped_by=self.stopped_by,
        )

    def _agree_on_stop(self, rule: str | None) -> str | None:
        """Rank 0's decision to stop, sent to every rank (one small broadcast per step)."""
        flag = torch.tensor([0 if rule is None else 1], device=self.ctx.device)
        dist.broadcast(flag, src=0)
        if not flag.item():
            return None
        name = [rule]
        dist.broadcast_object_list(name, src=0)  # only once, when the run stops
        return name[0]

    def open_metrics(self, start: int, end: int) -> MetricsSink | NullSink:
        """Rank 0's JSONL/wandb/progress sink (a no-op sink elsewhere) for steps start..end."""
        if self.rank != 0:
            return NullSink()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        run_config = redact_mapping(
            {**self.cfg.model_dump(mode="json"), "world_size": self.world_size}
        )
        (self.out_dir / "run_config.json").write_text(json.dumps(run_config, indent=1))
        return MetricsSink(self.out_dir, run_config, self.cfg, end, start)

    def close(self) -> None:
        self.engine.close()
        if self.owns_group:
            dist.destroy_process_group()


def rank_modules(cfg: RunConfig) -> list[str]:
    """What a rank of this run imports: `run_local` imports it once, ahead of the ranks."""
    return [__name__, *engine_modules(cfg.engine.name), *model_modules(cfg.model)]


def run_training(
    cfg: RunConfig, out_dir: str | Path, stop_at: int | None = None, capture_state: bool = False
) -> TrainResult:
    """Build, resume if configured, train to `stop_at` (or cfg.steps), checkpoint, report."""
    trainer = Trainer(cfg, out_dir)
    try:
        return trainer.train(stop_at=stop_at, capture_state=capture_state)
    finally:
        trainer.close()
