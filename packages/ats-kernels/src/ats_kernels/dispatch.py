"""The kernel dispatcher: `select(kernels)` returns the KernelSet a model uses for its whole life.

"reference" is the plain-PyTorch oracle; "triton" is ats_kernels.triton (needs a CUDA device, or
TRITON_INTERPRET=1 set before the first select("triton") to run the kernels on CPU tensors in
Triton's interpreter, which is for tests); "auto" picks triton on CUDA, reference otherwise, and logs
the choice once; "cuda" (CUDA C++ kernels) raises: none is implemented.
"""

import importlib
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ats_kernels.cross_entropy import ref_cross_entropy, ref_linear_cross_entropy
from ats_kernels.grouped_mlp import ref_grouped_mlp
from ats_kernels.moe_permute import ref_moe_permute, ref_moe_unpermute
from ats_kernels.moe_route import ref_moe_route
from ats_kernels.rms_norm import ref_rms_norm, ref_rms_norm_residual
from ats_kernels.rope import ref_rope, ref_rope_qkv
from ats_kernels.swiglu import ref_swiglu, ref_swiglu_packed

log = logging.getLogger("ats_kernels")

BACKENDS = ("auto", "reference", "triton", "cuda")


@dataclass(frozen=True)
class KernelSet:
    """One implementation of every op; `name` says which backend it came from."""

    name: str
    rms_norm: Callable
    rms_norm_residual: Callable
    rope: Callable
    rope_qkv: Callable
    swiglu: Callable
    swiglu_packed: Callable
    moe_route: Callable
    moe_permute: Callable
    moe_unpermute: Callable
    grouped_mlp: Callable
    cross_entropy: Callable
    linear_cross_entropy: Callable


REFERENCE = KernelSet(
    name="reference",
    rms_norm=ref_rms_norm,
    rms_norm_residual=ref_rms_norm_residual,
    rope=ref_rope,
    rope_qkv=ref_rope_qkv,
    swiglu=ref_swiglu,
    swiglu_packed=ref_swiglu_packed,
    moe_route=ref_moe_route,
    moe_permute=ref_moe_permute,
    moe_unpermute=ref_moe_unpermute,
    grouped_mlp=ref_grouped_mlp,
    cross_entropy=ref_cross_entropy,
    linear_cross_entropy=ref_linear_cross_entropy,
)

_auto_logged = False
_triton_set: KernelSet | None = None


def _triton_unavailable_reason() -> str | None:
    """Why the Triton kernels cannot run here, or None when they can."""
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None  # Triton's CPU interpreter (tests)
    if not torch.cuda.is_available():
        return (
            "no CUDA device is present (set TRITON_INTERPRET=1 before the first "
            "select('triton') to run them in Triton's CPU interpreter, for tests)"
        )
    return None


def _auto_reference_reason() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set"
    return _triton_unavailable_reason() or "triton unavailable"


def _triton_kernel_set() -> KernelSet:
    """Import ats_kernels.triton on first use: its kernels are decorated (compiled or interpreted)
    according to TRITON_INTERPRET at that moment."""
    global _triton_set
    if _triton_set is None:
        ops = importlib.import_module("ats_kernels.triton")
        _triton_set = KernelSet(
            name="triton",
            rms_norm=ops.rms_norm,
            rms_norm_residual=ops.rms_norm_residual,
            rope=ops.rope,
            rope_qkv=ops.rope_qkv,
            swiglu=ops.swiglu,
            swiglu_packed=ops.swiglu_packed,
            moe_route=ops.moe_route,
            moe_permute=ops.moe_permute,
            moe_unpermute=ops.moe_unpermute,
            grouped_mlp=ops.grouped_mlp,
            cross_entropy=ops.cross_entropy,
            linear_cross_entropy=ops.linear_cross_entropy,
        )
    return _triton_set


def select(kernels: str = "auto") -> KernelSet:
    """Return the KernelSet for `kernels` in {"auto", "reference", "triton", "cuda"}."""
    global _auto_logged
    if kernels not in BACKENDS:
        raise ValueError(
            f"ats_kernels.select: kernels = {kernels!r} is unknown; expected one of {BACKENDS}"
        )
    if kernels == "cuda":
        raise RuntimeError(
            "ats_kernels.select: kernels = 'cuda' requested but no CUDA C++ kernels are implemented "
            "(the fast path is 'triton')"
        )
    if kernels == "triton":
        reason = _triton_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"ats_kernels.select: kernels = 'triton' requested but {reason}")
        return _triton_kernel_set()
    if kernels == "auto":
        # the interpreter is for tests: auto never picks it
        interpreting = os.environ.get("TRITON_INTERPRET") == "1"
        use_triton = (
            torch.cuda.is_available() and not interpreting and _triton_unavailable_reason() is None
        )
        if not _auto_logged:
            why = "CUDA device and triton present" if use_triton else _auto_reference_reason()
            log.info(
                f"ats_kernels: kernels='auto' chose {'triton' if use_triton else 'reference'!r} ({why})"
            )
            _auto_logged = True
        if use_triton:
            return _triton_kernel_set()
    return REFERENCE
