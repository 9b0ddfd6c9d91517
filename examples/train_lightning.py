"""A PyTorch Lightning script under `lockstep check --script` (docs/scripts.md, "A PyTorch
Lightning script").

A small MLP with dropout in Lightning's usual style, on data the script makes: nothing is
downloaded. Run it through torchrun (`strategy="ddp"`, one CPU process a rank); the five lines
marked `lockstep` are all the adoption takes.
"""

import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lockstep import track  # lockstep
from lockstep.integrations.lightning import apply_protocol  # lockstep

GLOBAL_BATCH = 16
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.05)
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


L.seed_everything(0)
x = torch.randn(48, 8)  # 3 steps an epoch: a resume mid-epoch, and a reshuffle, in a short check
# the same global batch on any number of ranks (DDP's DistributedSampler splits each one)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), GLOBAL_BATCH // WORLD,
                    shuffle=True)  # fmt: skip
trainer_args = dict(accelerator="cpu", devices=WORLD, strategy="ddp", max_steps=20,
                    gradient_clip_val=0.5, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
trainer_args, ckpt_path = apply_protocol(trainer_args)  # lockstep
trainer = L.Trainer(**trainer_args)
trainer.fit(Regressor(), loader, ckpt_path=ckpt_path)  # lockstep: resume where asked
track.finish()  # lockstep: barrier, destroy_process_group, exit without gloo's abort
