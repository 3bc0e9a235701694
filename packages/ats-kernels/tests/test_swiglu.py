"""ref_swiglu against the written-out formula and gradcheck."""

import torch
from ats_kernels import ref_swiglu


def test_formula_odd_shape() -> None:
    torch.manual_seed(0)
    gate, up = (
        torch.randn(5, 123, 7, dtype=torch.float64),
        torch.randn(5, 123, 7, dtype=torch.float64),
    )
    expect = gate / (1 + torch.exp(-gate)) * up
    torch.testing.assert_close(ref_swiglu(gate, up), expect)


def test_gradcheck() -> None:
    torch.manual_seed(0)
    gate = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    up = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ref_swiglu, (gate, up))


def test_packed_is_swiglu_of_the_two_halves() -> None:
    from ats_kernels import ref_swiglu_packed

    torch.manual_seed(0)
    gate_up = torch.randn(4, 3, 10, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(
        ref_swiglu_packed(gate_up), ref_swiglu(gate_up[..., :5], gate_up[..., 5:])
    )
    assert torch.autograd.gradcheck(ref_swiglu_packed, (gate_up,))
