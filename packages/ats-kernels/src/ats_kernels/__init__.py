"""ats_kernels: one module per op, each with a plain-PyTorch `ref_<op>` beside its fast versions,
and `select(kernels)` choosing one KernelSet for a model's lifetime."""

from ats_kernels.cross_entropy import ref_cross_entropy, ref_linear_cross_entropy
from ats_kernels.dispatch import BACKENDS, REFERENCE, KernelSet, select
from ats_kernels.grouped_mlp import ref_grouped_mlp
from ats_kernels.moe_permute import ref_moe_permute, ref_moe_unpermute
from ats_kernels.moe_route import ref_moe_route
from ats_kernels.rms_norm import ref_rms_norm, ref_rms_norm_residual
from ats_kernels.rope import ref_rope, ref_rope_qkv, rope_tables
from ats_kernels.swiglu import ref_swiglu, ref_swiglu_packed

__all__ = [
    "BACKENDS",
    "REFERENCE",
    "KernelSet",
    "select",
    "ref_cross_entropy",
    "ref_linear_cross_entropy",
    "ref_grouped_mlp",
    "ref_moe_permute",
    "ref_moe_unpermute",
    "ref_moe_route",
    "ref_rms_norm",
    "ref_rms_norm_residual",
    "ref_rope",
    "ref_rope_qkv",
    "rope_tables",
    "ref_swiglu",
    "ref_swiglu_packed",
]
