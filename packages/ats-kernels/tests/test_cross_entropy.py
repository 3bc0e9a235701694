"""ref_cross_entropy against a manual -log softmax loop with ignore_index; linear CE equals the
unfused loss in value and gradient across chunk boundaries; gradcheck."""

import math

import pytest
import torch
from ats_kernels import ref_cross_entropy, ref_linear_cross_entropy


def test_matches_manual_with_ignore() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 5, dtype=torch.float64)
    targets = torch.tensor([0, 4, -100, 2, -100, 1])
    total, count = 0.0, 0
    for row, t in zip(logits.tolist(), targets.tolist(), strict=True):
        if t == -100:
            continue
        total += -(row[t] - math.log(sum(math.exp(v) for v in row)))
        count += 1
    assert ref_cross_entropy(logits, targets).item() == pytest.approx(total / count, rel=1e-12)


def test_bf16_is_computed_in_fp32() -> None:
    torch.manual_seed(0)
    logits = torch.randn(8, 300).bfloat16()
    targets = torch.randint(0, 300, (8,))
    loss = ref_cross_entropy(logits, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits.float(), targets))


def test_linear_matches_unfused_value_and_grad() -> None:
    torch.manual_seed(0)
    h = torch.randn(11, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([1, 2, -100, 3, 4, 5, 6, 0, -100, 1, 2])
    fused = ref_linear_cross_entropy(h, w, targets, chunk_size=3)
    fused.backward()
    g_h, g_w = h.grad.clone(), w.grad.clone()
    h.grad, w.grad = None, None
    plain = ref_cross_entropy(h @ w.T, targets)
    plain.backward()
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(g_h, h.grad)
    torch.testing.assert_close(g_w, w.grad)


def test_gradcheck() -> None:
    torch.manual_seed(0)
    h = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, -100, 3, 1, 2])
    assert torch.autograd.gradcheck(
        lambda a, b: ref_linear_cross_entropy(a, b, targets, chunk_size=2), (h, w)
    )
    assert torch.autograd.gradcheck(lambda a: ref_cross_entropy(a, targets), (h @ w.T,))
