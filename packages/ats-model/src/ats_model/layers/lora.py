"""LoRA modules (Hu et al. 2021, arXiv:2106.09685): y = W x + (alpha / r) B A dropout(x).

LoRALinear replaces an nn.Linear and keeps its weight Parameter under the same name (`wq.weight`
stays `wq.weight`), adding `lora_A` (r, in) and `lora_B` (out, r). The factored form runs in its
own forward; the fused q|k|v and gate|up GEMMs (attention.py, ffn.py) read the weights directly
and add `fused_lora_delta` of the same linears to their output, so fusion keeps the adapter.

ExpertsLoRA hangs under Experts as `experts.lora` and adds B_e A_e to each expert's stacked weight
(w1/w3 (E, F, C), w2 (E, C, F)) before the grouped MLP: the grouped kernels take whole weight
stacks, so the expert delta is in weight form, which has no input to drop out (peft's
`target_parameters` refuses lora_dropout for the same reason).

A is Kaiming-uniform, B zero (peft's default): a fresh adapter leaves the model's output unchanged.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

EXPERT_WEIGHTS = ("w1", "w3", "w2")


class LoRALinear(nn.Linear):
    """An nn.Linear with a low-rank update; `enabled = False` runs the base weight alone."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight  # the same Parameter: frozen or not is the caller's choice
        self.bias = base.bias
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank
        self.dropout = dropout  # on the adapter's input, in training only
        self.enabled = True

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """(alpha / r) B A dropout(x): x (..., in) -> (..., out)."""
        if self.training and self.dropout > 0:
            x = F.dropout(x, self.dropout)
        return F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale

    def delta_weight(self) -> torch.Tensor:
        """(alpha / r) B A, the (out, in) update a merge adds to the weight."""
        return (self.lora_B @ self.lora_A) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y + self.delta(x) if self.enabled else y

    def extra_repr(self) -> str:
        return (
            f"{self.in_features}, {self.out_features}, rank={self.lora_A.shape[0]}, "
            f"scale={self.scale:g}, dropout={self.dropout:g}"
        )


def fused_lora_delta(linears: tuple[nn.Linear, ...], x: torch.Tensor) -> torch.Tensor | None:
    """The LoRA output of `linears` concatenated on the last dim, as a GEMM over their
    concatenated weights produces it; None when none of them carries an enabled adapter."""
    if not any(isinstance(lin, LoRALinear) and lin.enabled for lin in linears):
        return None
    parts = [
        lin.delta(x)
        if isinstance(lin, LoRALinear) and lin.enabled
        else x.new_zeros(*x.shape[:-1], lin.out_features)
        for lin in linears
    ]
    return torch.cat(parts, dim=-1)  # (..., sum of out_features)


class ExpertsLoRA(nn.Module):
    """Per-expert low-rank updates of the stacked expert weights named in `targets`:
    `<w>_A` (E, r, in) and `<w>_B` (E, out, r) for w in w1, w3 (in C, out F) and w2 (in F, out C)."""

    def __init__(
        self, n_experts: int, dim: int, hidden: int, targets: tuple[str, ...], rank: int,
        alpha: float, device: torch.device, dtype: torch.dtype,
    ) -> None:  # fmt: skip
        super().__init__()
        self.targets = tuple(t for t in EXPERT_WEIGHTS if t in targets)
        if not self.targets:
            raise ValueError(f"ExpertsLoRA: targets {targets} name none of {EXPERT_WEIGHTS}")
        factory = {"device": device, "dtype": dtype}
        for name in self.targets:
            d_in, d_out = (hidden, dim) if name == "w2" else (dim, hidden)
            A = nn.Parameter(torch.empty(n_experts, rank, d_in, **factory))
            for e in range(n_experts):
                nn.init.kaiming_uniform_(A[e].data, a=math.sqrt(5))
            self.register_parameter(f"{name}_A", A)
            self.register_parameter(
                f"{name}_B", nn.Parameter(torch.zeros(n_experts, d_out, rank, **factory))
            )
        self.scale = alpha / rank
        self.enabled = True

    def delta_weight(self, name: str) -> torch.Tensor:
        """(alpha / r) B_e A_e for every expert e: the (E, out, in) update of weight `name`."""
        return torch.bmm(getattr(self, f"{name}_B"), getattr(self, f"{name}_A")) * self.scale

    def add_to(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{"w1", "w3", "w2"} stacked weights -> the same with the updates added (when enabled)."""
        if not self.enabled:
            return weights
        return {
            name: w + self.delta_weight(name) if name in self.targets else w
            for name, w in weights.items()
        }
