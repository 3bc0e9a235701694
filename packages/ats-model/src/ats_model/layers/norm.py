"""RMSNorm module; the math is the kernel set's rms_norm (fp32 inside, HF LlamaRMSNorm order)."""

import torch
from ats_kernels import KernelSet
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, kernels: KernelSet) -> None:
        super().__init__()
        self.eps = eps
        self.kernels = kernels
        self.weight = nn.Parameter(torch.empty(dim))

    def init_weights(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.rms_norm(x, self.weight, self.eps)
