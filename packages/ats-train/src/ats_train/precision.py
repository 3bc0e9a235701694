"""Mixed precision: autocast to bf16/fp16 around the forward, a GradScaler for fp16.

fp32 runs without autocast. fp16 needs loss scaling because its 5-bit exponent flushes small
gradients to zero (Micikevicius et al. 2018); bf16 keeps fp32's range and needs none. fp8 runs
under bf16 autocast with the Linear layers swapped for torchao's float8 ones (fp8.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ats_train.fp8 import check_fp8_device

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


@dataclass
class Precision:
    name: str  # "fp32" | "bf16" | "fp16" | "fp8"
    device_type: str  # "cpu" | "cuda"
    scaler: torch.amp.GradScaler | None  # fp16 only

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return _DTYPES[self.name]

    @contextlib.contextmanager
    def autocast(self, cache: bool = True) -> Iterator[None]:
        """cache=False: no reuse of weight casts across calls (CUDA graph capture requires it)."""
        if self.autocast_dtype is None:
            yield
            return
        with torch.autocast(
            device_type=self.device_type, dtype=self.autocast_dtype, cache_enabled=cache
        ):
            yield


def build_precision(name: str, device: torch.device) -> Precision:
    if name not in _DTYPES:
        raise ValueError(f"train.precision = {name!r} is not one of {', '.join(_DTYPES)}")
    if name == "fp8":
        check_fp8_device(device)
    scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
    return Precision(name, device.type, scaler)
