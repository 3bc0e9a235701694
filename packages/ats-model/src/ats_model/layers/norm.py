"""RMSNorm module; the math is the kernel set's rms_norm (fp32 inside, HF LlamaRMSNorm order), or
rms_norm_residual when the residual add before it is fused in.

Under autocast the output is written in the autocast dtype: every consumer of a norm (q/k/v,
FFN and router projections, the LM head) is a matmul that would cast it to that dtype first, so
the values it sees are the same and the fp32 round trip through memory is gone."""

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
        device = x.device.type
        out_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        if residual is None:
            return self.kernels.rms_norm(x, self.weight, self.eps, out_dtype)
        return self.kernels.rms_norm_residual(x, residual, self.weight, self.eps, out_dtype)
