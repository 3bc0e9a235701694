"""Adding the ChatML special tokens to a model that lacks them (model.add_chat_tokens): the
tokenizer gets the next free ids, the embeddings (and an untied head) as many new rows, each the
mean of the existing rows (as HF's resize_token_embeddings(mean_resizing=True)): a new token
starts where the average token is instead of at a random point far from all of them."""

from __future__ import annotations

import dataclasses

import torch
from ats_model import ModelConfig
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS

EMBEDDING_KEYS = ("tok_embeddings.weight", "output.weight")


def missing_chat_tokens(tok: Tokenizer) -> list[str]:
    return [t for t in CHAT_SPECIAL_TOKENS if t not in tok.special_tokens]


def with_chat_tokens(tok: Tokenizer) -> Tokenizer:
    """The same tokenizer with every missing ChatML token appended after its last id."""
    return tok.with_special_tokens(CHAT_SPECIAL_TOKENS)


def resized_config(config: ModelConfig, vocab_size: int) -> ModelConfig:
    """config with at least vocab_size rows (never fewer than it has)."""
    return dataclasses.replace(config, vocab_size=max(config.vocab_size, vocab_size))


def resize_embeddings(state: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """state with the embedding and untied head grown to vocab_size rows (mean of the old rows)."""
    out = dict(state)
    for key in EMBEDDING_KEYS:
        if key not in out or out[key].shape[0] >= vocab_size:
            continue
        w = out[key]  # (V, C)
        extra = w.float().mean(dim=0, keepdim=True).to(w.dtype).expand(vocab_size - w.shape[0], -1)
        out[key] = torch.cat([w, extra])  # (vocab_size, C)
    return out
