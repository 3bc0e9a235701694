"""SwiGLU feed-forward (Shazeer 2020): w2(silu(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down.

With `fused` set (ats-train sets it, Transformer.fuse_projections) and gradients on, gate and up
run as one GEMM over w13 = [w1; w3], concatenated per forward (the weights stay two parameters:
names and checkpoints do not change). Its input gradient is then one GEMM instead of two plus an
add, and the activation's gradient comes back as one tensor (swiglu_packed). Without gradients
the two projections run on the weights in place (see attention.py). LoRA adapters on w1/w3
(layers/lora.py) add their output to the fused GEMM's.
"""

import torch
import torch.nn.functional as F
from ats_kernels import KernelSet
from torch import nn

from ats_model.layers.lora import fused_lora_delta


class SwiGLUFFN(nn.Module):
    def __init__(self, dim: int, hidden: int, kernels: KernelSet, dropout: float) -> None:
        super().__init__()
        self.kernels = kernels
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        # on the hidden activations, in training only (ModelConfig.ffn_dropout)
        self.dropout = dropout
        self.fused = False  # one w13 GEMM when gradients are on (module docstring)

    def init_weights(self, std: float, resid_std: float) -> None:
        nn.init.normal_(self.w1.weight, std=std)
        nn.init.normal_(self.w3.weight, std=std)
        nn.init.normal_(self.w2.weight, std=resid_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.fused and torch.is_grad_enabled()):
            h = self.kernels.swiglu(self.w1(x), self.w3(x))
        else:
            w13 = torch.cat([self.w1.weight, self.w3.weight])  # (2F, C)
            h13 = F.linear(x, w13)  # (..., 2F)
            lora = fused_lora_delta((self.w1, self.w3), x)
            if lora is not None:
                h13 = h13 + lora
            h = self.kernels.swiglu_packed(h13)  # (..., 2F) -> (..., F)
        if self.training and self.dropout > 0:
            h = F.dropout(h, self.dropout)
        return self.w2(h)
