"""A Hugging Face Trainer script under `lockstep check --script` (README: "Check your own script").

A tiny GPT-2 with random weights from a transformers config and lockstep's synthetic token
stream: nothing is downloaded. Run it through torchrun; the lines marked `lockstep` are all
the adoption takes.
"""

import os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from lockstep import track
from lockstep.integrations.transformers import LockstepCallback, apply_protocol
from lockstep.train.data import synthetic_sample

SEQ_LEN, VOCAB, GLOBAL_BATCH = 32, 128, 8
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


class Synthetic(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        ids = synthetic_sample(0, i, SEQ_LEN, VOCAB)
        return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
# no dropout: its masks are per rank, so runs on 1 and 2 ranks could not agree
config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                    bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)  # fmt: skip
model = GPT2LMHeadModel(config)
if track.replay_dtype() == "float64":  # lockstep: a failed world-size check's float64 replay
    model = model.double()
args = TrainingArguments(
    output_dir="runs/hf-trainer",
    max_steps=20,
    per_device_train_batch_size=GLOBAL_BATCH // WORLD,  # the same global batch on any ranks
    learning_rate=1e-3,
    warmup_steps=2,
    max_grad_norm=1.0,
    seed=0,
    data_seed=0,
    use_cpu=True,
    report_to=[],
    save_strategy="no",
    disable_tqdm=True,
)
args, resume = apply_protocol(args)  # lockstep: max_steps, output_dir, resume
trainer = Trainer(model=model, args=args, train_dataset=Synthetic(), callbacks=[LockstepCallback()])
trainer.train(resume_from_checkpoint=resume)
track.finish()  # lockstep: barrier, destroy_process_group, exit without gloo's abort
