"""SwiGLU activation (Shazeer 2020, "GLU Variants Improve Transformer"): reference implementation."""

import torch
import torch.nn.functional as F


def ref_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise."""
    return F.silu(gate) * up
