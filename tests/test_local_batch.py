"""`lockstep.local_batch` in process: what makes a model's result depend on the batch split is
found by the torch functions its forward calls (modules, functional calls, attention's
dropout), named by module, and switched off where it can be; what is not local is not found."""

import torch
import torch.nn.functional as F
from torch import nn

from lockstep import local_batch


class RenamedNorm(nn.BatchNorm1d):
    """A subclass under another name: still BatchNorm over the batch."""


class Frozen(nn.Module):
    """torchvision's FrozenBatchNorm2d in short: fixed statistics, no batch_norm call."""

    def __init__(self, n: int):
        super().__init__()
        self.register_buffer("scale", torch.ones(n))

    def forward(self, x):
        return x * self.scale[:, None]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2, batch_first=True)
        self.renamed = RenamedNorm(8)
        self.frozen = Frozen(8)
        self.no_stats = nn.BatchNorm1d(8, track_running_stats=False)
        self.eval_norm = nn.BatchNorm1d(8)
        self.off = nn.Dropout(0.0)

    def forward(self, x):
        y, _ = self.attn(x, x, x)
        y = self.off(self.layer(y))
        q = y.unsqueeze(1)
        y = F.scaled_dot_product_attention(q, q, q, dropout_p=0.1).squeeze(1).transpose(1, 2)
        y = self.eval_norm(self.no_stats(self.frozen(self.renamed(y))))
        return torch.dropout(y, 0.3, True)


def test_every_local_batch_part_is_found_by_module_and_nothing_else():
    net = Net().train()
    net.eval_norm.eval()
    net.no_stats.eval()  # no running statistics: batch statistics even in eval mode
    with local_batch.watching(neutralise=False) as watch:
        net(torch.randn(4, 5, 8))
    assert set(watch.found) == {
        ("dropout", "attn"),
        ("dropout", "layer.self_attn"),
        ("dropout", "layer.dropout"),
        ("dropout", "layer.dropout1"),
        ("dropout", "layer.dropout2"),
        ("dropout", "(model)"),  # functional: SDPA's dropout_p, torch.dropout
        ("batchnorm", "renamed"),
        ("batchnorm", "no_stats"),
    }
    assert not any(watch.found.values())  # only looked


def test_switched_off_the_forward_no_longer_depends_on_the_batch_or_the_seed():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.5)).train()
    x = torch.randn(6, 8)
    with local_batch.watching(neutralise=True) as watch:
        whole = net(x)
        halves = torch.cat([net(x[:3]), net(x[3:])])
    assert watch.found == {("batchnorm", "1"): True, ("dropout", "2"): True}
    torch.testing.assert_close(whole, halves, rtol=0, atol=0)
    # the running statistics left as they were (the module still counts its batches)
    assert net[1].running_mean.eq(0).all() and net[1].running_var.eq(1).all()


def test_batchnorm_without_statistics_cannot_be_switched_off_and_the_hooks_go():
    net = nn.Sequential(nn.BatchNorm1d(4, track_running_stats=False)).train()
    with local_batch.watching(neutralise=True) as watch:
        net(torch.randn(3, 4))
    assert watch.found == {("batchnorm", "0"): False}
    net(torch.randn(3, 4))  # outside: no hook left to see it
    assert not watch.stack and len(watch.found) == 1
    assert local_batch.describe(watch.found) == "BatchNorm in 0"


def test_modules_are_named_inside_a_wrapper_as_ddp_holds_its_model():
    inner = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    wrapper = nn.Module()
    wrapper.module = inner  # DDP's, FSDP's and DeepSpeed's attribute
    wrapper.forward = lambda x: inner(x)
    assert local_batch.unwrap(wrapper) == [wrapper, inner]
    with local_batch.watching(neutralise=False) as watch:
        wrapper(torch.randn(3, 2))
    assert set(watch.found) == {("dropout", "1")}  # not "module.1"
