"""MoD capacity schedule values and applying a capacity to a live model."""

import pytest
import torch
from ats_model import build_model, mod_capacity_schedule, set_mod_capacity


def test_linear_and_cosine() -> None:
    assert mod_capacity_schedule(0, 100, 1.0, 0.125, warmup_steps=10) == 1.0
    assert mod_capacity_schedule(10, 100, 1.0, 0.125, warmup_steps=10) == 1.0
    assert mod_capacity_schedule(55, 100, 1.0, 0.125, warmup_steps=10) == pytest.approx(0.5625)
    assert mod_capacity_schedule(500, 100, 1.0, 0.125) == 0.125
    assert mod_capacity_schedule(50, 100, 1.0, 0.5, kind="cosine") == pytest.approx(0.75)
    with pytest.raises(ValueError, match="end = 0"):
        mod_capacity_schedule(1, 10, 1.0, 0.0)
    with pytest.raises(ValueError, match="kind = 'step'"):
        mod_capacity_schedule(1, 10, 1.0, 0.5, kind="step")


def test_set_capacity_changes_the_next_forward(make_config) -> None:
    model = build_model(make_config("mod"))
    idx = torch.randint(0, 23, (2, 16))
    assert model(idx).stats["mod/selected_fraction"].tolist() == [0.5, 0.5]
    set_mod_capacity(model, 0.25)
    assert model(idx).stats["mod/selected_fraction"].tolist() == [0.25, 0.25]
    with pytest.raises(ValueError, match="capacity = 2"):
        set_mod_capacity(model, 2)
