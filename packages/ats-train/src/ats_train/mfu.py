"""Model FLOPs utilization: achieved training FLOP/s over the accelerator's dense peak.

MFU as in PaLM (Chowdhery et al. 2022, appendix B): tokens/s x training FLOPs per token (from
ats_model.flops_per_token, active MoE parameters and MoD capacity counted) / peak FLOP/s. Peaks are
the vendors' dense (no 2:4 sparsity) tensor-core numbers; fp32 runs use the TF32 peak. On CPU or an
unlisted GPU there is no trustworthy peak, so MFU is reported as None rather than guessed.
"""

from __future__ import annotations

import torch

# device-name substring -> (bf16/fp16 dense peak, tf32 dense peak) in FLOP/s; first match wins.
PEAK_FLOPS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 494e12),
    ("H100 PCIe", 756e12, 378e12),
    ("H100", 989e12, 494e12),
    ("A100", 312e12, 156e12),
    ("L40S", 362e12, 183e12),
    ("A10G", 70e12, 35e12),
    ("L4", 121e12, 60e12),
)


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Dense peak FLOP/s of `device` at `precision`; None on CPU or an unlisted GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, half, tf32 in PEAK_FLOPS:
        if key in name:
            # fp8 against the bf16 peak, as torchtitan reports it: the attention, norms and the
            # layers fp8.py leaves out run in bf16, so the fp8 peak would understate the gain
            return half if precision in ("bf16", "fp16", "fp8") else tf32
    return None


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | None) -> float | None:
    if peak is None:
        return None
    return tokens_per_s * flops_per_token / peak
