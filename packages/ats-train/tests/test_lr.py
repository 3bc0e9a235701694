"""Schedules at known steps: warmup + cosine (nanoGPT's formula) and WSD."""

import math

import pytest
from ats_train.config import OptimSection
from ats_train.lr import build_lr_schedule


def test_cosine_known_values() -> None:
    s = build_lr_schedule(OptimSection(lr=1.0, min_lr=0.1, warmup_steps=10), total_steps=111)
    assert s(0) == pytest.approx(0.1)  # (0 + 1) / 10
    assert s(4) == pytest.approx(0.5)
    assert s(9) == pytest.approx(1.0)
    assert s(10) == pytest.approx(1.0)  # decay starts at the peak ...
    assert s(110) == pytest.approx(0.1)  # ... and ends at min_lr on the last step
    assert s(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos(pi/2) = 0
    assert s(35) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_wsd_known_values() -> None:
    optim = OptimSection(lr=1.0, min_lr=0.1, warmup_steps=10, schedule="wsd", decay_fraction=0.2)
    s = build_lr_schedule(optim, total_steps=100)
    assert s(0) == pytest.approx(0.1)
    assert s(9) == pytest.approx(1.0)
    assert [s(i) for i in (10, 50, 79, 80)] == pytest.approx([1.0] * 4)  # stable phase
    assert s(99) == pytest.approx(0.1)
    assert s(89) == pytest.approx(1.0 - 9 / 19 * 0.9)  # linear cool-down over steps 80..99


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_never_increases_after_warmup(schedule: str) -> None:
    s = build_lr_schedule(OptimSection(schedule=schedule, warmup_steps=5), total_steps=50)
    values = [s(i) for i in range(5, 50)]
    assert all(b <= a + 1e-15 for a, b in zip(values, values[1:], strict=False))
    assert min(values) == pytest.approx(OptimSection().min_lr)


def test_warmup_longer_than_run() -> None:
    s = build_lr_schedule(OptimSection(lr=1.0, warmup_steps=100), total_steps=10)
    assert [s(i) for i in range(10)] == pytest.approx([(i + 1) / 10 for i in range(10)])
