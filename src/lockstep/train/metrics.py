"""Per-step metrics: rank 0 writes metrics.jsonl (a `StepMetrics` row per optimizer step),
logs to wandb (offline unless configured) and shows a progress bar. Design: docs/design/train.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class StepMetrics:
    """A row of metrics.jsonl, named as the `LOCKSTEP_METRICS` protocol names its fields."""

    step: int  # optimizer step, from 1
    loss: float  # mean over micro batches and ranks
    grad_norm: float  # global, before clipping (clip.norm_type)
    clip_coef: float  # min(1, max_norm / (norm + 1e-6))
    lr: float
    tokens: int  # in the step's global batch
    tokens_per_s: float
    step_time_s: float  # on rank 0
    mem_bytes: int  # rank 0's peak GPU memory allocated, or CPU RSS
    mem_kind: str  # "cuda_peak_allocated" or "cpu_rss"
    loss_scale: float | None  # fp16 only
    skipped: bool  # fp16 overflow: no update
    mem_frac: float = 0.0  # mem_bytes as a share of the device's or machine's
    sync_time_s: float = 0.0  # rank 0's wait in the loss all-reduce: the slowest rank shows
    time: float = 0.0  # unix seconds at the step's end


def memory_total(device: torch.device) -> int:
    """The memory `memory()` is a share of: the GPU's, or the machine's."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import psutil

    return psutil.virtual_memory().total


def memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_peak_allocated"
    import psutil

    return psutil.Process().memory_info().rss, "cpu_rss"


def fingerprint_digests() -> dict[str, str] | None:
    """Section digests of this rank's environment (`lockstep.env.fingerprint`), if present."""
    try:
        from lockstep.env import fingerprint
    except ImportError:
        return None
    try:
        return dict(fingerprint.collect()["digests"])
    except Exception as exc:  # the fingerprint must never stop a training run
        return {"error": f"{type(exc).__name__}: {exc}"}


class MetricsSink:
    """Rank 0's outputs for step metrics; `run_config` must already be redacted."""

    def __init__(
        self, out_dir: Path, run_config: dict[str, Any], cfg, total_steps: int, start: int
    ):
        self.path = out_dir / "metrics.jsonl"
        self.file = self.path.open("a")
        self.wandb_run = None
        self.mode = cfg.logging.wandb
        if cfg.logging.wandb != "disabled":
            import wandb

            from lockstep.redact import scrub_text, scrubbed_argv

            with scrubbed_argv():  # wandb records the command line (`--set` values too)
                self.wandb_run = wandb.init(
                    project=scrub_text(cfg.logging.project),
                    name=scrub_text(cfg.logging.run_name) if cfg.logging.run_name else None,
                    dir=str(out_dir),
                    mode=cfg.logging.wandb,
                    config=run_config,  # already redacted
                    reinit="finish_previous",
                    # no console capture: wandb would keep the output before any redaction
                    settings=wandb.Settings(console="off"),
                )
            digests = fingerprint_digests()
            if digests is not None:
                self.wandb_run.config.update({"fingerprint": digests})
        self.progress = None
        if cfg.logging.progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            from lockstep import terminal

            self.progress = Progress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TimeRemainingColumn(),
                transient=False,
                console=terminal.console(),
            )
            self.task = self.progress.add_task(
                "train", total=total_steps, completed=start, loss="-"
            )
            self.progress.start()

    def log(self, m: StepMetrics) -> None:
        row = asdict(m)
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(
                {k: v for k, v in row.items() if k not in ("step", "mem_kind", "time")}, step=m.step
            )
        if self.progress is not None:
            self.progress.update(self.task, completed=m.step, loss=f"{m.loss:.4f}")

    def alert(self, alert) -> None:
        """An alert: a line in metrics.jsonl and on stderr, a wandb alert when online."""
        import sys

        self.file.write(json.dumps(alert.row()) + "\n")
        self.file.flush()
        message = f"lockstep: {alert.message()}"
        if self.progress is not None:
            self.progress.console.print(message, markup=False, style="bold red")
        else:
            print(message, file=sys.stderr, flush=True)
        if self.wandb_run is not None and self.mode == "online":
            level = "ERROR" if alert.action == "stop" else "WARN"
            self.wandb_run.alert(title=f"lockstep: {alert.rule}", text=alert.message(), level=level)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        self.file.close()


class NullSink:
    def log(self, m: StepMetrics) -> None:
        pass

    def alert(self, alert) -> None:
        pass

    def close(self) -> None:
        pass
