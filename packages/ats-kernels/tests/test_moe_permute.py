"""ref_moe_permute / ref_moe_unpermute against python grouping loops, round trip, gradcheck."""

import pytest
import torch
from ats_kernels import ref_moe_permute, ref_moe_unpermute


def test_permute_matches_loop() -> None:
    torch.manual_seed(0)
    N, k, E, C = 9, 2, 4, 3
    x = torch.randn(N, C, dtype=torch.float64)
    indices = torch.stack([torch.randperm(E)[:k] for _ in range(N)])
    x_sorted, per_expert, order = ref_moe_permute(x, indices, E)
    expect_rows, expect_counts = [], []
    for e in range(E):  # expert-major, then slot (token, choice) order
        slots = [(n, j) for n in range(N) for j in range(k) if indices[n, j] == e]
        expect_counts.append(len(slots))
        expect_rows += [x[n] for n, _ in slots]
    assert per_expert.tolist() == expect_counts and per_expert.dtype == torch.int64
    torch.testing.assert_close(x_sorted, torch.stack(expect_rows))
    assert sorted(order.tolist()) == list(range(N * k))


def test_unpermute_matches_loop_and_round_trip() -> None:
    torch.manual_seed(1)
    N, k, E, C = 7, 3, 5, 4
    x = torch.randn(N, C, dtype=torch.float64)
    indices = torch.stack([torch.randperm(E)[:k] for _ in range(N)])
    weights = torch.rand(N, k, dtype=torch.float64)
    x_sorted, _, order = ref_moe_permute(x, indices, E)
    y_sorted = x_sorted * 2 + 1  # any per-row function
    out = ref_moe_unpermute(y_sorted, order, weights)
    expect = torch.zeros(N, C, dtype=torch.float64)
    for row, slot in enumerate(order.tolist()):
        n, j = divmod(slot, k)
        expect[n] += weights[n, j] * y_sorted[row]
    torch.testing.assert_close(out, expect)
    ones = torch.full((N, k), 1.0 / k, dtype=torch.float64)
    torch.testing.assert_close(ref_moe_unpermute(x_sorted, order, ones), x)  # identity experts


def test_expert_out_of_range() -> None:
    with pytest.raises(ValueError, match="n_experts = 2"):
        ref_moe_permute(torch.zeros(2, 3), torch.tensor([[0], [3]]), 2)


def test_gradcheck() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(5, 2, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2], [1, 0]])

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        xs, _, order = ref_moe_permute(a, indices, 3)
        return ref_moe_unpermute(xs.sin(), order, b)

    assert torch.autograd.gradcheck(f, (x, w))
