"""The model: a transformers causal LM from a config with random weights (nothing is
downloaded, no dropout in the presets), or a user's factory. Design: docs/design/train.md."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lockstep.train.config import ModelConfig, resolve_factory

_NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def _gpt2(vocab_size: int, **fields) -> dict[str, Any]:
    """GPT-2's convention, the last token as BOS and EOS, inside a small vocabulary."""
    last = vocab_size - 1
    return dict(vocab_size=vocab_size, bos_token_id=last, eos_token_id=last, **fields)


PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2-tiny": (
        "gpt2",
        _gpt2(128, n_positions=64, n_embd=64, n_layer=2, n_head=4, **_NO_DROPOUT),
    ),
    "llama-tiny": (
        "llama",
        dict(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            attention_dropout=0.0,
        ),
    ),
    # large enough for the overhead benchmark
    "gpt2-small-bench": (
        "gpt2",
        _gpt2(512, n_positions=128, n_embd=256, n_layer=4, n_head=8, **_NO_DROPOUT),
    ),
}


def build_model(cfg: ModelConfig, seed: int) -> nn.Module:
    """Build on CPU with `seed` so that every rank and every engine starts from equal weights."""
    torch.manual_seed(seed)
    if cfg.factory:
        model = resolve_factory(cfg.factory, "model.factory")(cfg)
        if not isinstance(model, nn.Module):
            from lockstep.errors import UsageError

            raise UsageError(
                f"model.factory='{cfg.factory}' returned {type(model).__name__}, not an nn.Module"
            )
        return model
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, fields = PRESETS[cfg.preset]
    hf_config = AutoConfig.for_model(model_type, **{**fields, **cfg.overrides})
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
    # the loss transformers falls back to anyway, named: it warns on every start otherwise
    model.loss_type = "ForCausalLM"
    return model


def model_modules(cfg: ModelConfig) -> list[str]:
    """The transformers modules a preset's model is built from, for a launcher to import once
    ahead of its ranks."""
    if cfg.factory:
        return []
    model_type = PRESETS[cfg.preset][0]
    return ["transformers.models.auto.modeling_auto",
            f"transformers.models.{model_type}.modeling_{model_type}"]  # fmt: skip


def vocab_size(model: nn.Module) -> int:
    return model.get_input_embeddings().num_embeddings


def block_modules(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks, found through transformers' `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def causal_lm_loss(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token loss; models may return a tensor or an object with `.loss` (transformers)."""
    out = model(input_ids=input_ids, labels=input_ids)
    return out if isinstance(out, torch.Tensor) else out.loss
