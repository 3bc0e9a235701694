"""Signals: what the orchestrator reads, computed from a window of metrics.jsonl records.

Every signal is a plain float (or None when the run has no such quantity, e.g. no MoE layers, or
too few records). Per-layer MoE / MoD statistics are averaged over the window first (one step's
64-token batch is far too noisy to judge an expert by), then reduced over layers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass
class Signals:
    step: int  # the last record's step
    n: int  # train records in the window
    loss: float | None  # last train loss
    loss_mean: float | None  # mean train loss over the window (finite values only)
    loss_std: float | None  # its standard deviation
    loss_trend: float | None  # least-squares slope of loss vs step over the window (nats/step)
    loss_rel_change: float | None  # (mean of the window's 2nd half - 1st half) / 1st half
    loss_rise: float | None  # mean of the window's last third / its best earlier 3-step mean - 1
    loss_zscore: float | None  # last loss vs mean / std of the records before it
    loss_spike_ratio: float | None  # last loss / median of the (up to) 5 records before it
    loss_noise: float | None  # robust step-to-step spread of the loss (noise(), nats)
    loss_noise_rel: float | None  # loss_noise / loss_mean
    loss_rise_sigmas: float | None  # loss_rise in nats / loss_noise
    loss_change_se: float | None  # standard error of loss_rel_change from the noise (relative)
    val_loss: float | None  # last validation loss
    val_rel_change: float | None  # last val loss / best earlier val loss - 1
    grad_norm: float | None  # last gradient norm (before clipping)
    grad_norm_median: float | None  # median gradient norm over the window
    grad_spike_ratio: float | None  # max grad norm in the window / median of the window
    grad_spike_sigmas: float | None  # largest log grad-norm jump over its 5 predecessors / noise
    update_ratio: float | None  # last measured ||w_t - w_{t-1}|| / ||w_{t-1}||
    param_norm_growth: float | None  # last measured weight-matrix norm / the window's first
    lr: float | None  # last learning rate
    loss_scale: float | None  # fp16 loss scale (None without a GradScaler)
    nonfinite: int  # records in the window whose loss or grad norm is NaN / inf
    skipped: int  # steps in the window whose update was skipped
    tokens_per_s: float | None  # mean throughput over the window
    memory_gb: float | None  # last peak memory (CUDA allocated, else process max RSS)
    expert_util_min: float | None  # least-used expert's share x n_experts (1 = fair share)
    expert_util_max: float | None  # most-used expert's share x n_experts
    imbalance: float | None  # expert_util_max - 1 (window-averaged max violation)
    max_violation: float | None  # per-step max load / mean load - 1, window mean, worst layer
    routing_entropy: float | None  # router entropy / ln(n_experts), window mean, lowest layer
    dropped_fraction: float | None  # routed slots dropped by capacity, window mean, worst layer
    router_z: float | None  # router z-loss value, window mean, worst layer
    mod_selected_fraction: float | None  # share of tokens MoD blocks process, window mean
    mod_predictor_accuracy: float | None  # causal predictor agreement with top-k, window mean
    mod_predictor_selected: float | None  # share the causal predictor would keep, lowest layer
    flops: float | None  # training FLOPs spent so far (tokens x FLOPs per token)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _slope(steps: list[float], values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    ms, mv = statistics.fmean(steps), statistics.fmean(values)
    var = sum((s - ms) ** 2 for s in steps)
    if var == 0:
        return None
    return sum((s - ms) * (v - mv) for s, v in zip(steps, values, strict=True)) / var


def _layer_means(records: list[dict[str, Any]], key: str) -> list[Any] | None:
    """Window mean of a per-layer list (or per-layer, per-expert list of lists)."""
    rows = [r[key] for r in records if key in r]
    if not rows:
        return None
    first = rows[0]
    shape = _shape(first)
    rows = [row for row in rows if len(row) == len(first) and _shape(row) == shape]
    # numpy per layer: this runs for every per-step guard decision on a window of tens of records
    # x layers x experts, where statistics.fmean over generators cost milliseconds per step
    if isinstance(first[0], list):  # layers may differ in expert count (after expert surgery)
        return [np.mean([row[i] for row in rows], axis=0).tolist() for i in range(len(first))]
    return np.mean(rows, axis=0).tolist()


def _shape(row: list[Any]) -> tuple[int, ...]:
    """(layers,) for per-layer values, (layers, experts of layer 0, ...) for per-expert ones."""
    if not row or not isinstance(row[0], list):
        return (len(row),)
    return (len(row), *map(len, row))


def _is_bad(value: Any) -> bool:
    return value is not None and not math.isfinite(value)


def noise(values: list[float]) -> float | None:
    """The robust step-to-step spread of a noisy, trending series: 1.4826 x the median absolute
    difference of consecutive values / sqrt(2) (the std of one value's noise when the noise is
    Gaussian and independent; the trend cancels in the differences). None below 4 values."""
    if len(values) < 4:
        return None
    diffs = np.abs(np.diff(np.asarray(values, dtype=np.float64)))
    return float(1.4826 * np.median(diffs) / math.sqrt(2.0))


def jump_sigmas(values: list[float]) -> float | None:
    """The largest jump of a value over the median of the (up to) 5 before it, in units of the
    series' noise(); None with fewer than 4 values before the jump or no measurable noise."""
    spread = noise(values)
    if spread is None or spread <= 0 or len(values) < 5:
        return None
    jumps = [
        v - statistics.median(values[max(0, i - 5) : i]) for i, v in enumerate(values) if i >= 4
    ]
    return max(jumps) / spread


def loss_spike_ratio(train: list[dict[str, Any]]) -> float | None:
    """The last record's loss / the median of the (up to) 5 finite losses before it; None with
    fewer than 3 finite losses before it, a non-finite last loss, or a median <= 0 (objectives
    whose loss is zero or negative, e.g. GRPO's, have no ratio). Read every step by the
    skip_batch guard."""
    if not train:
        return None
    loss = train[-1]["loss"]
    prev = _finite([r["loss"] for r in train[:-1]])
    if loss is None or not math.isfinite(loss) or len(prev) < 3:
        return None
    median = statistics.median(prev[-5:])
    return loss / median if median > 0 else None


def loss_spike_sigmas(train: list[dict[str, Any]]) -> float | None:
    """The last record's loss above the median of the (up to) 5 finite losses before it, in units
    of the noise() of the finite losses before it; None as loss_spike_ratio, or with no noise.
    Read every step by the skip_batch guard."""
    if loss_spike_ratio(train) is None:
        return None
    prev = _finite([r["loss"] for r in train[:-1]])
    spread = noise(prev)
    if not spread:
        return None
    return (train[-1]["loss"] - statistics.median(prev[-5:])) / spread


def compute_signals(
    train: list[dict[str, Any]], val: list[dict[str, Any]], flops_per_token: float
) -> Signals:
    """Signals of the train records `train` (oldest first) and all val records so far."""
    last = train[-1] if train else {}
    losses = _finite([r["loss"] for r in train])
    prev = _finite([r["loss"] for r in train[:-1]])
    loss = last.get("loss")
    # np.std, not statistics.pstdev: that one sums exact Fractions, ~100x slower, every step
    loss_std = float(np.std(losses)) if len(losses) >= 2 else None
    zscore = None
    if loss is not None and math.isfinite(loss) and len(prev) >= 3:
        std = float(np.std(prev))
        zscore = (loss - statistics.fmean(prev)) / std if std > 0 else None
    finite = [(r["step"], r["loss"]) for r in train if r["loss"] is not None]
    finite = [(s, v) for s, v in finite if math.isfinite(v)]
    half = len(losses) // 2
    # Relative signals need a positive reference: a DPO or GRPO loss can be zero or negative,
    # and a change relative to it means nothing, so those signals stay None.
    rel_change = None
    first_mean = statistics.fmean(losses[:half]) if half >= 2 else None
    if first_mean is not None and first_mean > 0:
        rel_change = (statistics.fmean(losses[half:]) - first_mean) / first_mean
    rise = None
    rise_sigmas = None
    spread = noise(losses)
    third = len(losses) // 3
    if third >= 3:
        earlier = [statistics.fmean(losses[i : i + 3]) for i in range(len(losses) - third - 2)]
        best, recent = min(earlier), statistics.fmean(losses[-third:])
        rise = recent / best - 1.0 if best > 0 else None
        rise_sigmas = (recent - best) / spread if spread else None
    change_se = None
    if first_mean is not None and first_mean > 0 and spread is not None:
        # the two halves' means each carry noise / sqrt(half): their difference sqrt(2 / half)
        change_se = spread * math.sqrt(2.0 / half) / first_mean
    mean = _mean(losses)
    noise_rel = spread / mean if spread is not None and mean is not None and mean > 0 else None
    val_losses = _finite([r["val_loss"] for r in val])
    val_rel = None
    if len(val_losses) >= 2 and min(val_losses[:-1]) > 0:
        val_rel = val_losses[-1] / min(val_losses[:-1]) - 1.0
    grads = _finite([r["grad_norm"] for r in train])
    grad_median = statistics.median(grads) if grads else None
    grad_spike = max(grads) / grad_median if grads and grad_median else None
    log_grads = [math.log(g) for g in grads if g > 0]
    norms = _finite([r.get("param_norm") for r in train])
    ratios = _finite([r.get("update_ratio") for r in train])
    fraction = _layer_means(train, "moe/expert_fraction")
    util_min = util_max = None
    if fraction is not None:
        n_experts = len(fraction[0])
        util_min = min(min(layer) for layer in fraction) * n_experts
        util_max = max(max(layer) for layer in fraction) * n_experts
    entropy = _layer_means(train, "moe/entropy")
    routing_entropy = None
    if entropy is not None and fraction is not None:
        routing_entropy = min(entropy) / math.log(len(fraction[0])) if len(fraction[0]) > 1 else 1.0

    def worst(key: str, pick: Any = max) -> float | None:
        means = _layer_means(train, key)
        return None if means is None else pick(means)

    return Signals(
        step=last.get("step", 0),
        n=len(train),
        loss=loss,
        loss_mean=_mean(losses),
        loss_std=loss_std,
        loss_trend=_slope([float(s) for s, _ in finite], [v for _, v in finite]),
        loss_rel_change=rel_change,
        loss_rise=rise,
        loss_zscore=zscore,
        loss_spike_ratio=loss_spike_ratio(train),
        loss_noise=spread,
        loss_noise_rel=noise_rel,
        loss_rise_sigmas=rise_sigmas,
        loss_change_se=change_se,
        val_loss=val_losses[-1] if val_losses else None,
        val_rel_change=val_rel,
        grad_norm=last.get("grad_norm"),
        grad_norm_median=grad_median,
        grad_spike_ratio=grad_spike,
        grad_spike_sigmas=jump_sigmas(log_grads),
        update_ratio=ratios[-1] if ratios else None,
        param_norm_growth=norms[-1] / norms[0] if len(norms) >= 2 and norms[0] > 0 else None,
        lr=last.get("lr"),
        loss_scale=last.get("loss_scale"),
        nonfinite=sum(1 for r in train if _is_bad(r["loss"]) or _is_bad(r["grad_norm"])),
        skipped=sum(1 for r in train if r.get("skipped")),
        tokens_per_s=_mean(_finite([r.get("tokens_per_s") for r in train])),
        memory_gb=last.get("memory_gb"),
        expert_util_min=util_min,
        expert_util_max=util_max,
        imbalance=None if util_max is None else util_max - 1.0,
        max_violation=worst("moe/max_violation"),
        routing_entropy=routing_entropy,
        dropped_fraction=worst("moe/dropped_fraction"),
        router_z=worst("moe/router_z"),
        mod_selected_fraction=worst("mod/selected_fraction", min),
        mod_predictor_accuracy=worst("mod/predictor_accuracy", min),
        mod_predictor_selected=worst("mod/predictor_selected", min),
        flops=last["tokens"] * flops_per_token if "tokens" in last else None,
    )
