"""A user's model and data in a few lines, for a run config's `model.factory` and
`data.factory` (`TINY`): an embedding and a linear head that train in milliseconds, and two
fixed sequences."""

import torch
from torch import nn

TINY = {
    "model": {"factory": "support.tiny:tiny_model"},
    "data": {"factory": "support.tiny:tiny_data", "seq_len": 12},
}


class TinyLM(nn.Module):
    """A user model: embedding + linear head, returns the loss as a tensor."""

    def __init__(self, vocab: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, vocab)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, labels):
        logits = self.head(self.embed(input_ids[:, :-1]))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())


def tiny_model(cfg):
    return TinyLM()


def tiny_data(seq_len, vocab_size):
    return [torch.arange(seq_len) % vocab_size, (torch.arange(seq_len) * 3) % vocab_size]


class NormedLM(TinyLM):
    """TinyLM with BatchNorm over the local batch and dropout: the model families whose
    result depends on the world size by design (`lockstep.local_batch`)."""

    def __init__(self, vocab: int = 16):
        super().__init__(vocab)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.3)

    def forward(self, input_ids, labels):
        hidden = self.drop(self.norm(self.embed(input_ids[:, :-1]).transpose(1, 2)))
        logits = self.head(hidden.transpose(1, 2))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())


def normed_model(cfg):
    return NormedLM()
