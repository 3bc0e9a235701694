"""ref_moe_route against a manual softmax / sort / count per row, bias-only-selects, and gradcheck."""

import math

import pytest
import torch
from ats_kernels import ref_moe_route


def _manual(row: list[float], k: int, temp: float, bias: list[float] | None, norm: bool):
    exps = [math.exp(v / temp) for v in row]
    probs = [e / sum(exps) for e in exps]
    scores = probs if bias is None else [p + b for p, b in zip(probs, bias, strict=True)]
    chosen = sorted(range(len(row)), key=lambda e: -scores[e])[:k]
    w = [probs[e] for e in chosen]
    if norm:
        w = [v / sum(w) for v in w]
    return probs, chosen, w


@pytest.mark.parametrize(
    "k,temp,norm", [(1, 1.0, True), (2, 0.5, True), (3, 2.0, False), (5, 1.0, True)]
)
def test_matches_manual(k: int, temp: float, norm: bool) -> None:
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(7, 5, generator=g, dtype=torch.float64)
    bias = torch.randn(5, generator=g, dtype=torch.float64) * 0.1 if k == 2 else None
    weights, indices, probs, counts = ref_moe_route(logits, k, temp, bias, norm)
    assert indices.dtype == torch.int64 and weights.dtype == logits.dtype
    assert counts.dtype == torch.int64
    assert counts.tolist() == [sum(row.count(e) for row in indices.tolist()) for e in range(5)]
    for n in range(7):
        p, chosen, w = _manual(
            logits[n].tolist(), k, temp, None if bias is None else bias.tolist(), norm
        )
        torch.testing.assert_close(probs[n], torch.tensor(p, dtype=probs.dtype))
        assert indices[n].tolist() == chosen
        torch.testing.assert_close(weights[n], torch.tensor(w, dtype=torch.float64))


def test_bias_changes_choice_not_weights() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    w0, i0, _, _ = ref_moe_route(logits, 1, norm_topk=False)
    w1, i1, p1, _ = ref_moe_route(logits, 1, bias=torch.tensor([0.0, 0.0, 1.0]), norm_topk=False)
    assert i0.item() == 0 and i1.item() == 2
    torch.testing.assert_close(w1[0, 0], p1[0, 2])  # weight is the unbiased probability


def test_bf16_logits_fp32_probs() -> None:
    w, _, p, _ = ref_moe_route(torch.randn(4, 8).bfloat16(), 2)
    assert w.dtype == torch.bfloat16 and p.dtype == torch.float32


def test_bad_args() -> None:
    with pytest.raises(ValueError, match="top_k = 9"):
        ref_moe_route(torch.zeros(2, 8), 9)
    with pytest.raises(ValueError, match="temperature"):
        ref_moe_route(torch.zeros(2, 8), 1, temperature=0.0)


def test_gradcheck() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: ref_moe_route(x, 2, 0.7)[0], (logits,))
    assert torch.autograd.gradcheck(lambda x: ref_moe_route(x, 2, 0.7)[2], (logits,))
