"""Launch arithmetic shared by the Triton kernels: row block sizes, persistent grid size, and input
checks that must not stall the GPU stream.

Under TRITON_INTERPRET=1 (CPU tests) kernels run on CPU tensors; the grid is kept small there.
"""

import os

import torch
import triton

MAX_FUSED_SIZE = 65536  # widest row one program holds in registers (elements)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def row_block(n_cols: int, op: str) -> int:
    """Power-of-two block covering a whole row; rows wider than MAX_FUSED_SIZE are rejected."""
    block = triton.next_power_of_2(n_cols)
    if block > MAX_FUSED_SIZE:
        raise ValueError(f"{op}: last dim {n_cols} exceeds the fused row limit {MAX_FUSED_SIZE}")
    return block


def n_persistent_programs(device: torch.device, per_sm: int = 2) -> int:
    """Programs for a persistent grid: a few per SM on CUDA, 4 in the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count * per_sm
    return 4


def check_on_device(ok: torch.Tensor, message: str) -> None:
    """Raise ValueError(message) unless the 0-d bool tensor `ok` holds, without a host sync on CUDA.

    On CUDA the check is queued as a device-side assert (torch._assert_async): reading the value on
    the host would stall the stream once per MoE layer and direction. A failure then surfaces as a
    CUDA error carrying `message` at the next synchronization.
    """
    if ok.is_cuda:
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise ValueError(message)
