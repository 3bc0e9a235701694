"""ref_rms_norm against a per-row loop, HF LlamaRMSNorm (bf16 cast order) and gradcheck."""

import math

import pytest
import torch
from ats_kernels import ref_rms_norm
from transformers.models.llama.modeling_llama import LlamaRMSNorm


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 13), (5, 123, 123)])
def test_matches_row_loop(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    w = torch.randn(shape[-1], generator=g, dtype=torch.float64)
    out = ref_rms_norm(x.transpose(-1, -2).contiguous().transpose(-1, -2), w, 1e-6)  # strided x
    expect = []
    for row in x.reshape(-1, shape[-1]).tolist():
        rms = math.sqrt(sum(u * u for u in row) / len(row) + 1e-6)
        expect.append([v / rms * wi for v, wi in zip(row, w.tolist(), strict=True)])
    torch.testing.assert_close(
        out.reshape(-1, shape[-1]), torch.tensor(expect, dtype=torch.float64)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_hf_llama_rmsnorm(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.randn(4, 9, 48) * 3).to(dtype)
    hf = LlamaRMSNorm(48, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(48).to(dtype))
    out = ref_rms_norm(x, hf.weight, 1e-5)
    assert out.dtype == dtype
    torch.testing.assert_close(out, hf(x), rtol=0, atol=0)


def test_gradcheck() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ref_rms_norm(a, b, 1e-5), (x, w))


def test_out_dtype_casts_the_promoted_result() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(3, 16), torch.randn(16)
    out = ref_rms_norm(x, w, 1e-5, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref_rms_norm(x, w, 1e-5).bfloat16(), rtol=0, atol=0)
