"""SwiGLU activation (Shazeer 2020, "GLU Variants Improve Transformer"): reference implementation."""

import torch
import torch.nn.functional as F


def ref_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise."""
    return F.silu(gate) * up


def ref_swiglu_packed(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (..., 2N) = [gate | up], the output of one fused gate|up projection -> (..., N)."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu_packed: last dim {gate_up.shape[-1]} of gate_up must be even")
    gate, up = gate_up.chunk(2, dim=-1)
    return ref_swiglu(gate, up)
