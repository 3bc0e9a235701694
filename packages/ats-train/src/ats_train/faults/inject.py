"""Fault injection from TrainConfig [faults]: real conditions in a real run, for tests and drills.

Each fault changes what the run computes, not what the orchestrator sees: a NaN lands in a real
gradient, an OOM is a torch.OutOfMemoryError raised from inside the model's forward (on CUDA a
real allocation that does not fit), a routing collapse is a real router bias. Off by default;
each fires once per process (a rollback that replays the step does not replay the fault), except
a NaN gradient set to come back (faults.nan_grad_times).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ats_train.errors import ConfigError
from ats_train.faults.settings import FaultsSection

# added to the chosen experts' selection bias (routing collapse: nothing else is ever picked),
# subtracted from the dead experts' (nothing ever picks them)
COLLAPSE_BIAS = 100.0


class Faults:
    def __init__(self, faults: FaultsSection) -> None:
        self.config = faults
        self.fired: set[str] = set()
        self.nan_grads = 0  # passes through nan_grad_at_step that got the NaN
        self._step = 0  # the 1-based step being computed, for the OOM hook

    @property
    def any(self) -> bool:
        return any(
            getattr(self.config, name) is not None
            for name in vars(self.config)
            if name.endswith("_at_step")
        )

    def _due(self, name: str, step: int) -> bool:
        at = getattr(self.config, f"{name}_at_step")
        if at is None or step != at or name in self.fired:
            return False
        self.fired.add(name)
        return True

    def _due_nan_grad(self, step: int) -> bool:
        if step != self.config.nan_grad_at_step or self.nan_grads >= self.config.nan_grad_times:
            return False
        self.nan_grads += 1
        self.fired.add("nan_grad")
        return True

    def attach(self, model: torch.nn.Module) -> None:
        if self.config.oom_at_step is not None:
            model.register_forward_pre_hook(self._oom_hook)

    def _oom_hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        at, limit = self.config.oom_at_step, self.config.oom_max_micro_batch
        if at is None or self._step < at or not module.training or args[0].shape[0] <= limit:
            return
        self.fired.add("oom")
        device = args[0].device
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            torch.empty(free + (1 << 30), dtype=torch.uint8, device=device)  # raises a real OOM
        raise torch.OutOfMemoryError(
            f"injected out of memory (faults.oom_at_step = {at}): micro-batch {args[0].shape[0]} "
            f"> faults.oom_max_micro_batch = {limit}"
        )

    # ---- hooks the Trainer calls ----------------------------------------------------------------
    def lr_factor(self, step: int) -> float:
        """Multiplier on the lr of 1-based step `step` (plateau: stalled; diverge: too high)."""
        c, factor = self.config, 1.0
        if c.plateau_at_step is not None and step >= c.plateau_at_step:
            factor *= c.plateau_lr_factor
        if c.diverge_at_step is not None and step >= c.diverge_at_step:
            factor *= c.diverge_lr_factor
        return factor

    @torch.no_grad()
    def before_step(self, step: int, model: nn.Module) -> None:
        """Before 1-based step `step`: the model's weights drilled as configured."""
        self._step = step
        if self._due("routing_collapse", step):
            for layer in model.moe_layers():
                layer.expert_bias[: layer.top_k] += COLLAPSE_BIAS
        if self._due("dead_experts", step):
            for layer in model.moe_layers():
                if self.config.dead_experts >= layer.n_experts - layer.top_k:
                    raise ConfigError(
                        f"faults.dead_experts = {self.config.dead_experts} leaves fewer than "
                        f"top_k + 1 = {layer.top_k + 1} of {layer.n_experts} experts alive"
                    )
                layer.expert_bias[-self.config.dead_experts :] -= COLLAPSE_BIAS
        if self._due("router_sharpen", step):
            for layer in model.moe_layers():
                layer.router.weight.mul_(self.config.router_sharpen_factor)
        if self._due("mod_collapse", step):
            for layer in model.mod_layers():
                # w_out < 0 and large hidden activations: the logit is far below 0 for every token
                layer.mod_predictor.w_out.weight.fill_(-1.0)
                layer.mod_predictor.w_in.weight.mul_(50.0)
        if self._due("weight_growth", step):
            for p in model.parameters():
                if p.ndim >= 2:
                    p.mul_(self.config.weight_growth_factor)

    def batch(
        self, step: int, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of 1-based step `step`; a loss spike replaces its targets by random tokens."""
        if not self._due("loss_spike", step):
            return x, y
        vocab = int(max(x.max(), y.max())) + 1
        generator = torch.Generator().manual_seed(step)
        return x, torch.randint(0, vocab, y.shape, generator=generator)

    @torch.no_grad()
    def after_backward(self, step: int, model: nn.Module) -> None:
        """After step `step`'s backward: its gradients drilled as configured."""
        nan_grad, grad_spike = self._due_nan_grad(step), self._due("grad_spike", step)
        if not (nan_grad or grad_spike):
            return  # the common case: no parameter walk on the host between backward and step
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if nan_grad:
            grads[0].view(-1)[0] = float("nan")
        if grad_spike:
            for g in grads:
                g.mul_(self.config.grad_spike_factor)
