"""ref_grouped_mlp against a per-row loop (each row through its own expert), empty experts, gradcheck."""

import pytest
import torch
import torch.nn.functional as F
from ats_kernels import ref_grouped_mlp


def _weights(E: int, F_: int, C: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(*s, generator=g, dtype=torch.float64)
        for s in ((E, F_, C), (E, F_, C), (E, C, F_))
    ]


@pytest.mark.parametrize("counts", [[3, 0, 2, 1], [0, 0, 5, 0], [1, 1, 1, 1]])
def test_matches_row_loop(counts: list[int]) -> None:
    E, F_, C = 4, 5, 3
    w1, w3, w2 = _weights(E, F_, C, 0)
    x = torch.randn(sum(counts), C, dtype=torch.float64)
    out = ref_grouped_mlp(x, torch.tensor(counts), w1, w3, w2)
    experts = [e for e, c in enumerate(counts) for _ in range(c)]
    for row, e in enumerate(experts):
        h = F.silu(w1[e] @ x[row]) * (w3[e] @ x[row])
        torch.testing.assert_close(out[row], w2[e] @ h)


def test_hidden_scale_multiplies_each_rows_hidden_activations() -> None:
    counts = [2, 0, 3]
    w1, w3, w2 = _weights(3, 4, 2, 2)
    x = torch.randn(5, 2, dtype=torch.float64)
    scale = torch.tensor([0, 2.0]).repeat(5, 2)[:, :4]  # every other hidden unit dropped
    out = ref_grouped_mlp(x, torch.tensor(counts), w1, w3, w2, hidden_scale=scale)
    experts = [e for e, c in enumerate(counts) for _ in range(c)]
    for row, e in enumerate(experts):
        h = F.silu(w1[e] @ x[row]) * (w3[e] @ x[row]) * scale[row]
        torch.testing.assert_close(out[row], w2[e] @ h)
    with pytest.raises(ValueError, match=r"hidden_scale \(5, 3\) must be \(M, F\) = \(5, 4\)"):
        ref_grouped_mlp(x, torch.tensor(counts), w1, w3, w2, hidden_scale=scale[:, :3])


def test_no_rows() -> None:
    w1, w3, w2 = _weights(2, 3, 4, 0)
    out = ref_grouped_mlp(torch.zeros(0, 4, dtype=torch.float64), torch.tensor([0, 0]), w1, w3, w2)
    assert out.shape == (0, 4)


def test_bad_counts() -> None:
    w1, w3, w2 = _weights(2, 3, 4, 0)
    with pytest.raises(ValueError, match="sums to 3"):
        ref_grouped_mlp(torch.zeros(4, 4, dtype=torch.float64), torch.tensor([1, 2]), w1, w3, w2)
    with pytest.raises(ValueError, match="3 entries"):
        ref_grouped_mlp(torch.zeros(3, 4, dtype=torch.float64), torch.tensor([1, 1, 1]), w1, w3, w2)


def test_gradcheck() -> None:
    w = [t.requires_grad_() for t in _weights(3, 2, 3, 1)]
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    counts = torch.tensor([2, 0, 3])
    assert torch.autograd.gradcheck(lambda a, b, c, d: ref_grouped_mlp(a, counts, b, c, d), (x, *w))
    scale = torch.rand(5, 2, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: ref_grouped_mlp(a, counts, b, c, d, hidden_scale=scale), (x, *w)
    )
