"""One rank of the engine tests, launched through torchrun's launcher API, through the public API.

Runs several engines one after another in one process group, the way a warm test worker
would, so that the suite pays the process start (6-20 s on 2 cores) twice, not per engine.

    straight: train to step 2 (checkpoint), record state, train on to the end
    resume:   load BASE/ENGINE/straight/checkpoints/step_00000002, record state, train on
Rank 0 writes BASE/ENGINE/<mode>-state.pt (state at the checkpoint) and <mode>.json.
"""

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from lockstep.train.config import load_config
from lockstep.train.trainer import Trainer

SMOKE = Path(__file__).resolve().parents[2] / "smoke"


def run(mode: str, engine: str, base: Path, overrides: list[str]) -> None:
    out = base / engine
    if mode == "resume":
        checkpoint = out / "straight" / "checkpoints" / "step_00000002"
        overrides = [*overrides, f'checkpoint.resume="{checkpoint}"']
    trainer = Trainer(load_config(SMOKE / f"cpu-{engine}.toml", overrides), out / mode)
    rows = []
    if mode == "straight":
        rows += trainer.train(stop_at=2).steps
    state = {
        "step": trainer.step,
        "lr": trainer.engine.lr(),
        "data": trainer.stream.state_dict(),
        "params": trainer.engine.full_parameters(),
        "optimizer": trainer.engine.full_optimizer_state(),
    }
    result = trainer.train()
    rows += result.steps
    if trainer.rank == 0:
        torch.save(state, out / f"{mode}-state.pt")
        summary = {"digest": result.param_digest, "steps": [asdict(r) for r in rows]}
        (out / f"{mode}.json").write_text(json.dumps(summary))
    trainer.close()
    print(f"rank {trainer.rank}: {mode} {engine} done", file=sys.stderr, flush=True)


def main(mode: str, base: str, engines: str, *overrides: str) -> None:
    """One rank, started by `lockstep.launch.run_local` (a process forked for this
    launch: a resume really starts from the files on disk)."""
    torch.distributed.init_process_group("gloo")
    for engine in engines.split(","):
        run(mode, engine, Path(base), list(overrides))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
