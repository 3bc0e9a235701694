"""RMSNorm module; the math is the kernel set's rms_norm (fp32 inside, HF LlamaRMSNorm order), or
rms_norm_residual when the residual add before it is fused in."""

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

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with `residual`, (norm(x + residual), x + residual) from one fused pass.
        Both go through forward, not a method that reads self.weight, so ZeRO-3's module hooks
        gather the weight either way."""
        if residual is None:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        return self.kernels.rms_norm_residual(x, residual, self.weight, self.eps)
