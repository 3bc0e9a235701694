"""SwiGLU feed-forward (Shazeer 2020): w2(silu(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down."""

import torch
from ats_kernels import KernelSet
from torch import nn


class SwiGLUFFN(nn.Module):
    def __init__(self, dim: int, hidden: int, kernels: KernelSet) -> None:
        super().__init__()
        self.kernels = kernels
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def init_weights(self, std: float, resid_std: float) -> None:
        nn.init.normal_(self.w1.weight, std=std)
        nn.init.normal_(self.w3.weight, std=std)
        nn.init.normal_(self.w2.weight, std=resid_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.kernels.swiglu(self.w1(x), self.w3(x)))
