"""Mixture-of-Experts SwiGLU FFN: router -> top-k -> (capacity drop) -> permute -> grouped MLP -> combine.

Losses: Switch load balancing (Fedus et al. 2021, eq. 4) and ST-MoE router z-loss (Zoph et al.
2022, eq. 5). Optional DeepSeek-V3 aux-loss-free balancing (arXiv:2412.19437): a per-expert bias
added to the probabilities for the choice only, nudged after every training forward.

Capacity (GShard / Switch): capacity = ceil(capacity_factor * N * k / E) slots per expert. Priority
is by choice rank, then by position: every token's 1st choice is served before any 2nd choice, and
within a rank earlier tokens (in the flattened B*T order) win. A dropped slot contributes nothing
(its token keeps the other choices, weights not renormalized, and always the residual).
"""

import math
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from ats_kernels import KernelSet
from torch import nn

from ats_model.config import ModelConfig
from ats_model.layers.ffn import SwiGLUFFN
from ats_model.layers.lora import ExpertsLoRA


class MoERecord(NamedTuple):
    # A NamedTuple, not a dataclass: FSDP2 hooks the grad tensors of a sharded block's output to
    # all-gather its weights before backward, and older torch finds them with pytree's
    # tree_flatten, which walks NamedTuples but not unregistered dataclasses.
    lb: torch.Tensor  # Switch load-balancing loss (grad reaches the router)
    z: torch.Tensor  # router z-loss (grad reaches the router)
    tokens_per_expert: torch.Tensor  # (E,) routed slots per expert, before dropping (detached)
    entropy: torch.Tensor  # mean per-token entropy of the router probabilities, nats
    dropped_fraction: torch.Tensor  # dropped slots / (N * k)
    max_violation: torch.Tensor  # max load / mean load - 1, on routed slots
    router_z: torch.Tensor  # the z-loss value, detached


class ExpertExchange(Protocol):
    """Expert parallelism's seam, set from outside the model (ats_train/backends/
    expert_parallel.py): takes the rows of all E experts, grouped by expert, runs `local_mlp` on
    the rows of this rank's experts wherever they were routed, and returns the outputs in the
    input's row order."""

    def __call__(
        self,
        x_sorted: torch.Tensor,
        per_expert: torch.Tensor,
        local_mlp: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor: ...


def capacity_keep(indices: torch.Tensor, counts: torch.Tensor, capacity: int) -> torch.Tensor:
    """indices (N, k), counts (E,) slots per expert -> keep (N, k) bool: at most `capacity` slots
    per expert, priority as above."""
    n_tokens, top_k = indices.shape
    prio = indices.T.reshape(-1)  # (k*N,) all 1st choices in token order, then all 2nd, ...
    order = torch.argsort(prio, stable=True)
    group_start = torch.cumsum(counts, 0) - counts  # (E,)
    rank = torch.empty_like(prio)
    rank[order] = torch.arange(prio.numel(), device=prio.device) - group_start[prio[order]]
    return (rank < capacity).view(top_k, n_tokens).T  # (N, k)


def expert_capacity(capacity_factor: float, n_tokens: int, top_k: int, n_experts: int) -> int:
    """ceil(capacity_factor * N * k / E), rounded first so float noise never adds a slot."""
    return math.ceil(round(capacity_factor * n_tokens * top_k / n_experts, 6))


class Experts(nn.Module):
    """E SwiGLU experts stored stacked: w1/w3 (E, F, C), w2 (E, C, F).

    Called as a module (not read as weights by MoEFFN): ZeRO-3 gathers a module's partitioned
    parameters in its own forward hook. Read from the parent, they were gathered only by
    DeepSpeed's attribute-access fallback, which registers a parameter with the running module
    the first time the forward touches it."""

    def __init__(
        self, n_experts: int, dim: int, hidden: int, kernels: KernelSet, dropout: float
    ) -> None:
        super().__init__()
        self.kernels = kernels
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        # on the hidden activations, in training only (ModelConfig.ffn_dropout)
        self.dropout = dropout
        self.lora: ExpertsLoRA | None = None  # per-expert LoRA updates (adapters/lora.py sets it)
        # expert parallelism: w1/w3/w2 hold only experts first..first+count-1 of all E, and
        # `exchange` moves rows to and from the ranks holding the others
        self.exchange: ExpertExchange | None = None

    def forward(self, x_sorted: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
        """x_sorted (M, C) rows grouped by expert, per_expert (E,) rows per group -> (M, C)."""
        if self.exchange is not None:
            return self.exchange(x_sorted, per_expert, self.local_mlp)
        return self.local_mlp(x_sorted, per_expert)

    @torch.no_grad()
    def shard(self, first: int, count: int, exchange: ExpertExchange) -> None:
        """Keep only experts first..first+count-1 (this rank's share); `exchange` reaches the
        rest. Parameters are replaced: build the optimizer after sharding."""
        n_experts = self.w1.shape[0]
        if self.exchange is not None or self.lora is not None:
            raise ValueError("Experts.shard: already sharded, or carrying LoRA adapters")
        if not (0 <= first and count > 0 and first + count <= n_experts):
            raise ValueError(
                f"Experts.shard: experts {first}..{first + count - 1} not in 0..{n_experts - 1}"
            )
        for name in ("w1", "w3", "w2"):
            local = getattr(self, name)[first : first + count].clone()
            setattr(self, name, nn.Parameter(local))
        self.exchange = exchange

    def local_mlp(self, x_sorted: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
        """The experts this module holds: x_sorted (M, C) grouped by them, per_expert (E_local,)."""
        scale = None
        if self.training and self.dropout > 0:
            keep = 1.0 - self.dropout
            rows, hidden = x_sorted.shape[0], self.w1.shape[1]
            scale = torch.empty(rows, hidden, device=x_sorted.device).bernoulli_(keep).div_(keep)
        w = {"w1": self.w1, "w3": self.w3, "w2": self.w2}
        if self.lora is not None:
            w = self.lora.add_to(w)
        return self.kernels.grouped_mlp(
            x_sorted, per_expert, w["w1"], w["w3"], w["w2"], hidden_scale=scale
        )

    def init_weights(self, std: float, resid_std: float) -> None:
        nn.init.normal_(self.w1, std=std)
        nn.init.normal_(self.w3, std=std)
        nn.init.normal_(self.w2, std=resid_std)


class MoEFFN(nn.Module):
    """Runtime knobs (plain attributes the orchestrator may change between steps): top_k,
    capacity_factor (None = dropless), temperature, norm_topk, bias_update_rate."""

    def __init__(self, config: ModelConfig, kernels: KernelSet) -> None:
        super().__init__()
        moe = config.moe
        self.kernels = kernels
        self.router = nn.Linear(config.dim, moe.n_experts, bias=False)
        self.experts = Experts(
            moe.n_experts, config.dim, config.ffn_dim, kernels, config.ffn_dropout
        )
        self.register_buffer("expert_bias", torch.zeros(moe.n_experts), persistent=True)
        self.shared = (
            SwiGLUFFN(
                config.dim, moe.n_shared_experts * config.ffn_dim, kernels, config.ffn_dropout
            )
            if moe.n_shared_experts > 0
            else None
        )
        self.top_k = moe.top_k
        self.capacity_factor = moe.capacity_factor
        self.temperature = moe.router_temperature
        self.norm_topk = moe.norm_topk
        self.bias_update_rate = moe.bias_update_rate

    @property
    def n_experts(self) -> int:
        return self.router.weight.shape[0]

    def init_weights(self, std: float, resid_std: float) -> None:
        nn.init.normal_(self.router.weight, std=std)
        self.experts.init_weights(std, resid_std)
        self.expert_bias.zero_()
        if self.shared is not None:
            self.shared.init_weights(std, resid_std)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, MoERecord]:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, C)
        n_tokens, n_experts, top_k = flat.shape[0], self.n_experts, self.top_k
        n_slots = n_tokens * top_k
        logits = self.router(flat)  # (N, E)
        # routed (E,): slots per expert, before dropping, counted by the routing kernel
        weights, indices, probs, routed = self.kernels.moe_route(
            logits, top_k, self.temperature, self.expert_bias, self.norm_topk
        )

        if self.capacity_factor is None:
            x_sorted, per_expert, order = self.kernels.moe_permute(flat, indices, n_experts)
            n_kept = n_slots
        else:
            capacity = expert_capacity(self.capacity_factor, n_tokens, top_k, n_experts)
            keep = capacity_keep(indices, routed, capacity)
            # dropped slots go to an extra group E, sorted last, and are never computed
            grouped = torch.where(keep, indices, torch.full_like(indices, n_experts))
            x_sorted, per_expert, order = self.kernels.moe_permute(flat, grouped, n_experts + 1)
            per_expert = per_expert[:n_experts]
            n_kept = int(per_expert.sum())
            x_sorted = x_sorted[:n_kept]
        y_sorted = self.experts(x_sorted, per_expert)  # (n_kept, C)
        if n_kept < n_slots:
            y_sorted = torch.cat([y_sorted, y_sorted.new_zeros(n_slots - n_kept, shape[-1])])
        y = self.kernels.moe_unpermute(y_sorted, order, weights)  # (N, C)
        if self.shared is not None:
            y = y + self.shared(flat)

        record = self._record(logits, probs, routed, n_slots, n_kept)
        if self.training and self.bias_update_rate > 0:
            self._update_bias(routed)
        return y.view(shape), record

    def _record(
        self,
        logits: torch.Tensor,
        probs: torch.Tensor,
        routed: torch.Tensor,
        n_slots: int,
        n_kept: int,
    ) -> MoERecord:
        n_experts = routed.numel()
        f = routed.to(probs.dtype) / n_slots  # fraction of token-slots per expert
        lb = n_experts * torch.sum(f * probs.mean(0))
        compute = logits if logits.dtype == torch.float64 else logits.float()
        z = torch.logsumexp(compute, dim=-1).pow(2).mean()
        with torch.no_grad():
            load = routed.float()
            entropy = torch.special.entr(probs.detach()).sum(-1).mean().float()
            # a fill, not a host-to-device copy of a Python float (which would block the host)
            dropped = torch.full((), (n_slots - n_kept) / n_slots, device=logits.device)
            violation = load.max() / (n_slots / n_experts) - 1
        return MoERecord(lb, z, load, entropy, dropped, violation, z.detach().float())

    @torch.no_grad()
    def prune_experts(self, keep: list[int]) -> None:
        """Keep only experts `keep` (in that order). Parameters are replaced: rebuild the optimizer,
        and set config.moe.n_experts once every layer has the same count (save/load checks it)."""
        if (
            not keep
            or len(set(keep)) != len(keep)
            or not all(0 <= e < self.n_experts for e in keep)
        ):
            raise ValueError(
                f"prune_experts: keep = {keep} must be distinct experts of 0..{self.n_experts - 1}"
            )
        if len(keep) < self.top_k:
            raise ValueError(
                f"prune_experts: {len(keep)} experts left, fewer than top_k = {self.top_k}"
            )
        idx = torch.tensor(keep, device=self.router.weight.device)
        self._replace(lambda t: t[idx])

    @torch.no_grad()
    def split_expert(self, expert: int, noise_std: float = 0.0) -> int:
        """Append a copy of `expert` (weights, router row, bias), optionally perturbed by
        N(0, noise_std) to break the tie; returns the new expert's index. Replaces parameters."""
        if not 0 <= expert < self.n_experts:
            raise ValueError(f"split_expert: expert = {expert} not in 0..{self.n_experts - 1}")

        def grow(t: torch.Tensor) -> torch.Tensor:
            copy = t[expert : expert + 1].clone()
            if noise_std > 0 and t.dim() > 1:
                copy += torch.randn_like(copy) * noise_std
            return torch.cat([t, copy])

        self._replace(grow)
        return self.n_experts - 1

    def _replace(self, fn) -> None:
        """Apply fn to every per-expert tensor (dim 0 = expert) and re-register the results."""
        if self.experts.exchange is not None:
            raise ValueError(
                "pruning or splitting experts needs every expert on one rank, not expert "
                "parallelism (parallel.expert_parallel > 1)"
            )
        self.router.weight = nn.Parameter(fn(self.router.weight))
        for name in ("w1", "w3", "w2"):
            setattr(self.experts, name, nn.Parameter(fn(getattr(self.experts, name))))
        self.expert_bias = fn(self.expert_bias)

    @torch.no_grad()
    def _update_bias(self, routed: torch.Tensor) -> None:
        """DeepSeek-V3 eq. 16 spirit: raise the bias of underloaded experts, lower overloaded ones."""
        load = routed.to(self.expert_bias.dtype)
        self.expert_bias += self.bias_update_rate * torch.sign(load.mean() - load)
