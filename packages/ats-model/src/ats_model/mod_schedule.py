"""MoD capacity schedules: the trainer calls one per step and assigns the result to every MoD layer
(`set_mod_capacity(model, mod_capacity_schedule(step, ...))`), e.g. start dense and anneal down."""

import math

from ats_model.model import Transformer


def mod_capacity_schedule(
    step: int,
    total_steps: int,
    start: float,
    end: float,
    warmup_steps: int = 0,
    kind: str = "linear",
) -> float:
    """Capacity at `step`: `start` for the first warmup_steps, then linear or cosine to `end` at
    total_steps, `end` afterwards."""
    if kind not in ("linear", "cosine"):
        raise ValueError(f"mod_capacity_schedule: kind = {kind!r}, expected 'linear' or 'cosine'")
    for name, value in (("start", start), ("end", end)):
        if not 0 < value <= 1:
            raise ValueError(f"mod_capacity_schedule: {name} = {value} must be in (0, 1]")
    if total_steps <= warmup_steps:
        raise ValueError(
            f"mod_capacity_schedule: total_steps = {total_steps} must exceed warmup_steps = {warmup_steps}"
        )
    if step <= warmup_steps:
        return start
    frac = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    if kind == "cosine":
        frac = 0.5 * (1 - math.cos(math.pi * frac))
    return start + (end - start) * frac


def set_mod_capacity(model: Transformer, capacity: float) -> None:
    """Set `.capacity` on every MoD layer (takes effect at the next forward)."""
    if not 0 < capacity <= 1:
        raise ValueError(f"set_mod_capacity: capacity = {capacity} must be in (0, 1]")
    for layer in model.mod_layers():
        layer.capacity = capacity
