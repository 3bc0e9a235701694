"""The optimizer update that skips a step whose gradients are not finite, and where it waits.

The trainer must know the global gradient norm (metrics, the orchestrator) and must never apply
an inf/NaN gradient. Reading the norm on the host before launching the update leaves the GPU idle
while the host wakes up and launches it. A fused AdamW
takes the verdict as a device tensor instead (`found_inf`: the protocol GradScaler uses with
fused optimizers; the kernel then leaves parameters, moments and the step count untouched), so
the update is queued first and the host reads the norm while the GPU runs it.
"""

from __future__ import annotations

import math

import torch


def queue_step_if_finite(optimizer: torch.optim.Optimizer, norm: torch.Tensor) -> None:
    """A fused optimizer's update, which the device skips when `norm` is inf or NaN: no wait."""
    optimizer.found_inf = (~torch.isfinite(norm)).to(torch.float32)
    optimizer.grad_scale = None
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf, optimizer.grad_scale


def step_if_finite(optimizer: torch.optim.Optimizer, norm: torch.Tensor) -> tuple[float, bool]:
    """Apply the update unless `norm` (the gradients' global norm, a tensor) is inf or NaN.
    Returns (the norm as a float, whether the update ran)."""
    if optimizer.defaults.get("fused"):
        queue_step_if_finite(optimizer, norm)
        grad_norm = float(norm)  # the one wait, after the update is queued
        return grad_norm, math.isfinite(grad_norm)
    grad_norm = float(norm)
    if not math.isfinite(grad_norm):
        return grad_norm, False  # a non-finite gradient would turn every weight into NaN
    optimizer.step()
    return grad_norm, True
