"""AdamW with decoupled weight decay on matrices only: norms, biases and embeddings are not decayed.

Why no decay on embeddings and gains: decaying them pulls token vectors and RMSNorm scales towards
zero without regularizing anything useful (nanoGPT, Llama recipes). Fused AdamW on CUDA.
"""

from __future__ import annotations

import torch
from torch import nn

from ats_train.config import OptimSection


def split_decay(model: nn.Module) -> tuple[list[str], list[str]]:
    """(decayed, not decayed) parameter names: matrices decay; vectors and embeddings do not."""
    embedding_ids = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or id(p) in embedding_ids:
            no_decay.append(name)
        else:
            decay.append(name)
    return decay, no_decay


def build_optimizer(
    model: nn.Module, optim: OptimSection, device: torch.device
) -> torch.optim.AdamW:
    params = dict(model.named_parameters())
    decay, no_decay = split_decay(model)
    groups = [
        {"params": [params[n] for n in decay], "weight_decay": optim.weight_decay},
        {"params": [params[n] for n in no_decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        fused=device.type == "cuda",
    )
