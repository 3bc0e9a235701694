"""The dispatcher: reference and auto give the ref_ ops; unavailable or unknown backends raise."""

import logging

import ats_kernels
import pytest
import torch
from ats_kernels import KernelSet, select


def test_reference_holds_every_ref_op() -> None:
    ks = select("reference")
    assert isinstance(ks, KernelSet) and ks.name == "reference"
    assert ks.rms_norm is ats_kernels.ref_rms_norm
    assert ks.rms_norm_residual is ats_kernels.ref_rms_norm_residual
    assert ks.rope is ats_kernels.ref_rope
    assert ks.swiglu is ats_kernels.ref_swiglu
    assert ks.moe_route is ats_kernels.ref_moe_route
    assert ks.moe_permute is ats_kernels.ref_moe_permute
    assert ks.moe_unpermute is ats_kernels.ref_moe_unpermute
    assert ks.grouped_mlp is ats_kernels.ref_grouped_mlp
    assert ks.cross_entropy is ats_kernels.ref_cross_entropy
    assert ks.linear_cross_entropy is ats_kernels.ref_linear_cross_entropy


def test_auto_logs_its_choice_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ats_kernels.dispatch, "_auto_logged", False)
    with caplog.at_level(logging.INFO, logger="ats_kernels"):
        assert select("auto").name == "reference"
        select("auto")
    assert sum("chose 'reference'" in r.getMessage() for r in caplog.records) == 1


def test_cuda_backend_raises_with_reason() -> None:
    with pytest.raises(RuntimeError, match="'cuda' requested but no CUDA C\\+\\+ kernels"):
        select("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_triton_without_cuda_raises_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="'triton' requested but no CUDA device is present"):
        select("triton")


def test_unknown_backend() -> None:
    with pytest.raises(ValueError, match="'fast' is unknown"):
        select("fast")
