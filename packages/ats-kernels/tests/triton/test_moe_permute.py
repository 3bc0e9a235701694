"""Triton moe_permute / moe_unpermute against the references: identical stable order, gradients."""

import pytest
import torch
from ats_kernels import ref_moe_permute, ref_moe_unpermute


def _indices(N: int, E: int, k: int, g: torch.Generator, device: str) -> torch.Tensor:
    scores = torch.rand(N, E, generator=g, device=device)
    return torch.topk(scores, k, dim=-1).indices  # distinct experts per token, as routing gives


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("E,k", [(8, 2), (5, 3), (64, 8)])
def test_permute_unpermute_match_reference(
    device: str, dtype: torch.dtype, E: int, k: int, close
) -> None:
    from ats_kernels.triton import moe_permute, moe_unpermute

    g = torch.Generator(device=device).manual_seed(0)
    # interpreted on the CPU: 19 tokens still span two slot blocks of the counting sort at E = 64
    # (block_s = 128 < 19 * 8 slots), the block-to-block scan that one block never exercises
    N, C = (19, 40) if device == "cpu" else (16384, 4096)
    idx = _indices(N, E, k, g, device)
    base = torch.randn(N, 2 * C, generator=g, device=device).to(dtype)
    x = base[:, :C].requires_grad_()  # row stride 2C
    xs, counts, order = moe_permute(x, idx, E)
    xs_ref, counts_ref, order_ref = ref_moe_permute(x, idx, E)
    assert torch.equal(order, order_ref) and torch.equal(counts, counts_ref)
    assert torch.equal(xs, xs_ref)
    dxs = torch.randn(xs.shape, generator=g, device=device).to(dtype)
    close(torch.autograd.grad(xs, x, dxs)[0], torch.autograd.grad(xs_ref, x, dxs)[0], "dx")

    y = torch.randn(N * k, C, generator=g, device=device).to(dtype).requires_grad_()
    w = torch.rand(N, k, generator=g, device=device).to(dtype).requires_grad_()
    out = moe_unpermute(y, order, w)
    out_ref = ref_moe_unpermute(y, order_ref, w)
    close(out, out_ref, "combine")
    dout = torch.randn(out.shape, generator=g, device=device).to(dtype)
    grads = torch.autograd.grad(out, (y, w), dout)
    grads_ref = torch.autograd.grad(out_ref, (y, w), dout)
    close(grads[0], grads_ref[0], "dy")
    close(grads[1], grads_ref[1], "dweights")


def test_permute_empty_experts_and_bad_index(device: str, expect_input_error) -> None:
    from ats_kernels.triton import moe_permute

    idx = torch.tensor([[3, 0], [3, 0], [0, 3]], device=device)  # experts 1, 2 get nothing
    x = torch.arange(6.0, device=device).reshape(3, 2)
    xs, counts, order = moe_permute(x, idx, 4)
    xs_ref, counts_ref, order_ref = ref_moe_permute(x, idx, 4)
    assert (
        counts.tolist() == [3, 0, 0, 3]
        and torch.equal(order, order_ref)
        and torch.equal(xs, xs_ref)
    )
    expect_input_error(
        device,
        "outside \\[0, n_experts = 3\\)",
        "from ats_kernels.triton import moe_permute\n"
        "idx = torch.tensor([[3, 0], [3, 0], [0, 3]], device=device)\n"
        "moe_permute(torch.arange(6.0, device=device).reshape(3, 2), idx, 3)",
    )
