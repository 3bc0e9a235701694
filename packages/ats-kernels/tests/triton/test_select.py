"""select("triton") hands out the ats_kernels.triton ops (interpreter on CPU, compiled on CUDA)."""

import ats_kernels.triton as triton_ops
import torch
from ats_kernels import select


def test_select_triton_holds_every_triton_op(device: str) -> None:
    ks = select("triton")
    assert ks.name == "triton"
    for field in ("rms_norm", "rms_norm_residual", "rope", "rope_qkv", "swiglu", "swiglu_packed", "moe_route", "moe_permute",
                  "moe_unpermute", "grouped_mlp", "cross_entropy", "linear_cross_entropy"):  # fmt: skip
        assert getattr(ks, field) is getattr(triton_ops, field), field
    if device == "cuda":
        assert select("auto") is ks
    else:
        assert select("auto").name == "reference"  # the interpreter is never chosen by "auto"
    x = torch.randn(3, 16, device=device)
    torch.testing.assert_close(ks.rms_norm(x, torch.ones(16, device=device), 1e-6),
                               select("reference").rms_norm(x, torch.ones(16, device=device), 1e-6))  # fmt: skip
