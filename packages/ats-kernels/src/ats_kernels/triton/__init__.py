"""Triton fast paths of every ats_kernels op, each a torch.autograd.Function with the ref_ signature.

Importing this package decorates the kernels: set TRITON_INTERPRET=1 BEFORE the import to run them
on CPU tensors (Triton's interpreter; tests do this), otherwise they compile for the CUDA device.
"""

from ats_kernels.triton.cross_entropy import cross_entropy, linear_cross_entropy
from ats_kernels.triton.grouped_mlp import grouped_mlp
from ats_kernels.triton.moe_permute import moe_permute, moe_unpermute
from ats_kernels.triton.moe_route import moe_route
from ats_kernels.triton.rms_norm import rms_norm, rms_norm_residual
from ats_kernels.triton.rope import rope, rope_qkv
from ats_kernels.triton.swiglu import swiglu, swiglu_packed

__all__ = [
    "cross_entropy",
    "grouped_mlp",
    "linear_cross_entropy",
    "moe_permute",
    "moe_route",
    "moe_unpermute",
    "rms_norm",
    "rms_norm_residual",
    "rope",
    "rope_qkv",
    "swiglu",
    "swiglu_packed",
]
