"""step_if_finite: a finite norm gives the plain optimizer step (bitwise); an inf/NaN norm leaves
parameters, moments and the step count untouched, for the fused AdamW (found_inf on device) and
the unfused one (host check)."""

import copy
import math

import pytest
import torch
from ats_train.backends.guarded_step import step_if_finite

# (device, fused): the fused AdamW on CUDA is what ats-train builds there
CASES = [
    ("cpu", False),
    ("cpu", True),
    pytest.param("cuda", True, marks=pytest.mark.gpu),
]


def _setup(device: str, fused: bool) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)


def _grads(model: torch.nn.Module, seed: int, poison: float | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g).to(p.device)
    if poison is not None:
        model.weight.grad[1, 2] = poison
    return torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)


@pytest.mark.parametrize(("device", "fused"), CASES)
def test_finite_norm_is_the_plain_step(device: str, fused: bool) -> None:
    model, opt = _setup(device, fused)
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, fused=fused)
    for seed in (1, 2):
        norm = _grads(model, seed)
        twin_norm = _grads(twin, seed)
        grad_norm, stepped = step_if_finite(opt, norm)
        twin_opt.step()
        assert stepped and grad_norm == pytest.approx(float(twin_norm), rel=0, abs=0)
        for a, b in zip(model.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not hasattr(opt, "found_inf") and not hasattr(opt, "grad_scale")


@pytest.mark.parametrize(("device", "fused"), CASES)
@pytest.mark.parametrize("poison", [math.inf, math.nan])
def test_non_finite_norm_changes_nothing(device: str, fused: bool, poison: float) -> None:
    model, opt = _setup(device, fused)
    step_if_finite(opt, _grads(model, 1))  # moments and a step count exist
    params = [p.detach().clone() for p in model.parameters()]
    state = copy.deepcopy(opt.state_dict()["state"])
    grad_norm, stepped = step_if_finite(opt, _grads(model, 2, poison))
    assert not stepped and not math.isfinite(grad_norm)
    for before, p in zip(params, model.parameters(), strict=True):
        torch.testing.assert_close(p, before, rtol=0, atol=0)
    after = opt.state_dict()["state"]
    for i, entry in state.items():
        for key, value in entry.items():
            torch.testing.assert_close(after[i][key], value, rtol=0, atol=0, msg=f"{i} {key}")
