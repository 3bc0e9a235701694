"""Learning-rate schedules: linear warmup then cosine decay, or warmup-stable-decay (WSD).

A schedule is a pure function of the optimizer step (0-based index of the update being taken), so
its checkpoint state is the step alone. Cosine: Loshchilov & Hutter 2017 (SGDR) as used by nanoGPT;
WSD: Hu et al. 2024 (MiniCPM), linear cool-down over the last `decay_fraction` of the steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ats_train.config import OptimSection


@dataclass(frozen=True)
class LRSchedule:
    name: str  # "cosine" | "wsd"
    lr: float  # peak
    min_lr: float
    warmup_steps: int
    total_steps: int
    decay_start: int  # first step of the decay phase

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            # (step + 1) / warmup: the first update already moves, the last warmup step hits peak.
            return self.lr * (step + 1) / self.warmup_steps
        last = self.total_steps - 1
        if step >= last:
            return self.min_lr if last > self.decay_start else self.lr
        if step < self.decay_start:
            return self.lr
        # progress: 0 at decay_start (peak lr), 1 at the last step (min_lr)
        progress = (step - self.decay_start) / (last - self.decay_start)
        span = self.lr - self.min_lr
        if self.name == "cosine":
            return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * span
        return self.lr - progress * span


def build_lr_schedule(optim: OptimSection, total_steps: int) -> LRSchedule:
    warmup = min(optim.warmup_steps, total_steps)
    if optim.schedule == "cosine":
        decay_start = warmup
    else:
        decay_steps = max(1, round(optim.decay_fraction * total_steps))
        decay_start = max(warmup, total_steps - decay_steps)
    return LRSchedule(optim.schedule, optim.lr, optim.min_lr, warmup, total_steps, decay_start)
