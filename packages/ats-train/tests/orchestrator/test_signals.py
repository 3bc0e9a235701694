"""Signals on a synthetic metrics stream, against numpy computed from the same numbers."""

import math

import numpy as np
import pytest
from ats_train.orchestrator.signals import Signals, compute_signals


def stream(n: int = 12) -> list[dict]:
    rng = np.random.default_rng(0)
    records = []
    for i in range(n):
        step = i + 1
        fractions = rng.dirichlet(np.ones(4), size=2)  # (layers, experts)
        records.append(
            {
                "step": step,
                "loss": 5.0 - 0.1 * step + 0.01 * (-1) ** step,
                "lr": 1e-3,
                "grad_norm": 1.0 + 0.1 * i,
                "tokens": step * 128,
                "tokens_per_s": 1000.0 + step,
                "param_norm": 10.0 + 0.5 * i,
                "update_ratio": 0.01 * step,
                "memory_gb": 0.5,
                "moe/expert_fraction": fractions.tolist(),
                "moe/entropy": [1.0, 1.2],
                "moe/dropped_fraction": [0.0, 0.1 * step / n],
                "moe/max_violation": [0.5, 1.5],
                "moe/router_z": [4.0, 5.0],
                "mod/selected_fraction": [0.5],
                "mod/predictor_accuracy": [0.7],
                "mod/predictor_selected": [0.4],
            }
        )
    return records


def test_every_signal_matches_a_numpy_reference() -> None:
    records = stream()
    val = [{"step": 5, "val_loss": 4.0}, {"step": 10, "val_loss": 4.4}]
    s = compute_signals(records, val, flops_per_token=100.0)
    loss = np.array([r["loss"] for r in records])
    steps = np.array([r["step"] for r in records], dtype=float)
    grads = np.array([r["grad_norm"] for r in records])
    frac = np.mean([r["moe/expert_fraction"] for r in records], axis=0)  # (layers, E)
    assert s.step == 12 and s.n == 12
    assert s.loss == loss[-1]
    assert s.loss_mean == pytest.approx(loss.mean())
    assert s.loss_std == pytest.approx(loss.std())
    assert s.loss_trend == pytest.approx(np.polyfit(steps, loss, 1)[0])
    assert s.loss_rel_change == pytest.approx(loss[6:].mean() / loss[:6].mean() - 1)
    best3 = min(loss[i : i + 3].mean() for i in range(12 - 4 - 2))
    assert s.loss_rise == pytest.approx(loss[-4:].mean() / best3 - 1)
    assert s.loss_zscore == pytest.approx((loss[-1] - loss[:-1].mean()) / loss[:-1].std())
    assert s.loss_spike_ratio == pytest.approx(loss[-1] / np.median(loss[-6:-1]))
    assert s.val_loss == 4.4 and s.val_rel_change == pytest.approx(0.1)
    assert s.grad_norm == grads[-1]
    assert s.grad_norm_median == pytest.approx(np.median(grads))
    assert s.grad_spike_ratio == pytest.approx(grads.max() / np.median(grads))
    assert s.update_ratio == pytest.approx(0.12)
    assert s.param_norm_growth == pytest.approx(15.5 / 10.0)
    assert s.lr == 1e-3 and s.loss_scale is None
    assert s.nonfinite == 0 and s.skipped == 0
    assert s.tokens_per_s == pytest.approx(1000 + steps.mean())
    assert s.memory_gb == 0.5
    assert s.expert_util_min == pytest.approx(frac.min() * 4)
    assert s.expert_util_max == pytest.approx(frac.max() * 4)
    assert s.imbalance == pytest.approx(frac.max() * 4 - 1)
    assert s.max_violation == pytest.approx(1.5)
    assert s.routing_entropy == pytest.approx(1.0 / math.log(4))
    assert s.dropped_fraction == pytest.approx(np.mean([0.1 * k / 12 for k in range(1, 13)]))
    assert s.router_z == pytest.approx(5.0)
    assert s.mod_selected_fraction == 0.5 and s.mod_predictor_accuracy == pytest.approx(0.7)
    assert s.mod_predictor_selected == pytest.approx(0.4)
    assert s.flops == pytest.approx(12 * 128 * 100.0)
    assert len(Signals.__dataclass_fields__) >= 22  # the issue asks for at least 20 signals


def test_nonfinite_skipped_and_missing_families() -> None:
    records = [
        {"step": i + 1, "loss": 3.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 10} for i in range(6)
    ]
    records[2]["loss"] = float("nan")
    records[3]["grad_norm"] = float("inf")
    records[4]["skipped"] = True
    records[4]["grad_norm"] = None
    s = compute_signals(records, [], flops_per_token=1.0)
    assert s.nonfinite == 2 and s.skipped == 1
    assert s.loss_mean == 3.0  # NaN excluded
    assert s.expert_util_min is None and s.routing_entropy is None  # a dense model has no MoE
    assert s.mod_selected_fraction is None and s.val_loss is None


def test_loss_spike_is_measured_against_the_recent_median() -> None:
    records = [{"step": i + 1, "loss": 4.0, "grad_norm": 1.0, "lr": 1.0} for i in range(10)]
    records.append({"step": 11, "loss": 6.0, "grad_norm": None, "lr": 1.0})
    s = compute_signals(records, [], flops_per_token=0.0)
    assert s.loss_spike_ratio == pytest.approx(1.5)


def test_noise_is_the_robust_spread_of_consecutive_differences() -> None:
    from ats_train.orchestrator.signals import noise

    # a falling trend plus alternating -+0.1: 9.9, 9.1, 7.9, 7.1, 5.9, 5.1; the differences'
    # sizes 0.8, 1.2, 0.8, 1.2, 0.8 have the median 0.8
    values = [10.0 - i + (0.1 if i % 2 else -0.1) for i in range(6)]
    assert noise(values) == pytest.approx(1.4826 * 0.8 / math.sqrt(2.0))
    assert noise(values[:3]) is None  # too few values to tell


def test_a_spike_is_measured_in_units_of_the_noise() -> None:
    from ats_train.orchestrator.signals import jump_sigmas, loss_spike_sigmas

    flat = [2.0, 2.1] * 5  # |diffs| all 0.1: noise 0.1 x 1.4826 / sqrt 2
    spread = 0.1 * 1.4826 / math.sqrt(2.0)
    # the spike at the end: 5.0 over the median 2.0 or 2.1 of the 5 before it (2.1, 2.0, 2.1, ...)
    jump = jump_sigmas([*flat, 5.0])
    assert jump is not None and jump > 20
    records = [{"step": i + 1, "loss": v, "grad_norm": 1.0} for i, v in enumerate([*flat, 5.0])]
    # the noise of the losses before the spike only; the median of the 5 before it
    # [2.1, 2.0, 2.1, 2.0, 2.1] is 2.1
    assert loss_spike_sigmas(records) == pytest.approx((5.0 - 2.1) / spread)
    records[-1]["loss"] = 2.05
    assert abs(loss_spike_sigmas(records)) < 1


def test_loss_spike_ratio_has_no_value_for_losses_at_or_below_zero() -> None:
    """GRPO's loss is 0 when every completion of a group earns the same reward (no advantage),
    and may be negative: a ratio to such a median means nothing (it divided by zero)."""
    from ats_train.orchestrator.signals import loss_spike_ratio, loss_spike_sigmas

    zeros = [{"loss": 0.0} for _ in range(6)]
    assert loss_spike_ratio(zeros) is None and loss_spike_sigmas(zeros) is None
    negative = [{"loss": v} for v in (-0.2, -0.1, -0.3, -0.2, 0.5)]
    assert loss_spike_ratio(negative) is None
    assert loss_spike_ratio([{"loss": v} for v in (2.0, 2.0, 2.0, 3.0)]) == 1.5


def test_instability_events_are_relative_to_the_runs_own_noise() -> None:
    """A healthy run with noisy batch losses (the 124M stdlib run swung 2.8-4.0 step to step) has
    no events; one loss far above that noise is one event; a non-finite loss is one."""
    from ats_train.orchestrator.kinds.run import instability_events

    rng = np.random.default_rng(0)
    noisy = [{"loss": 3.5 + 0.4 * z, "grad_norm": 0.6} for z in rng.standard_normal(100)]
    assert instability_events(noisy, sigmas=8.0) == 0
    spiked = [*noisy[:50], {"loss": 3.5 + 8.0, "grad_norm": 0.6}, *noisy[50:]]
    assert instability_events(spiked, sigmas=8.0) == 1
    assert instability_events([*noisy, {"loss": float("nan"), "grad_norm": 0.6}], 8.0) == 1


@pytest.mark.parametrize("offset", [-5.0, -4.9])  # losses around zero, and all negative
def test_relative_signals_are_none_without_a_positive_reference(offset: float) -> None:
    """A DPO or GRPO loss can be zero or negative (GRPO's is minus the reward): relative changes
    against it mean nothing, so they are None and no division by zero happens; the signals in
    units of the run's own noise stay defined."""
    records = stream()
    for r in records:
        r["loss"] += offset  # from about 0 (or -0.1) down to about -1.1 (-1.2)
    val = [{"step": 5, "val_loss": 0.0}, {"step": 10, "val_loss": -0.2}]
    s = compute_signals(records, val, flops_per_token=100.0)
    assert s.loss_rel_change is None and s.loss_rise is None
    assert s.loss_change_se is None and s.loss_noise_rel is None and s.val_rel_change is None
    loss = np.array([r["loss"] for r in records])
    best3 = min(loss[i : i + 3].mean() for i in range(12 - 4 - 2))
    assert s.loss_rise_sigmas == pytest.approx((loss[-4:].mean() - best3) / s.loss_noise)
