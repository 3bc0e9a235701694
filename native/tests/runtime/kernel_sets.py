"""The kernel sets of the native runtime, for tests that run one case per set, forced by name
(Model(kernels=...), quantized_matmul(kernels=...)): every set is a case on every machine, and a
set this CPU cannot run is a skip, never a silent pass, so an AVX-512 machine also tests AVX2."""

import ats_native
import pytest

ALL_KERNELS = ("scalar", "avx2", "avx512", "neon")
# sets with integer dot products (kernels.h: dot_q8_packed / dot_q4_packed); NEON has none and
# runs the fp32-activation kernels
INTEGER_KERNELS = ("scalar", "avx2", "avx512")


def available_kernels() -> list[str]:
    """The sets this CPU runs: scalar always, then what ats_native.cpu_features() reports."""
    f = ats_native.cpu_features()
    names = ["scalar"]
    if f["avx2"] and f["fma"]:
        names.append("avx2")
    if f["avx512f"] and f["avx512bw"] and f["avx512vl"]:
        names.append("avx512")
    if f["neon"]:
        names.append("neon")
    return names


def kernel_params(names: tuple[str, ...] = ALL_KERNELS) -> list:
    """pytest params, one per kernel set in names, each marked skip where this CPU lacks it."""
    available = available_kernels()
    return [
        pytest.param(
            name,
            id=name,
            marks=pytest.mark.skipif(
                name not in available, reason=f"this CPU cannot run the {name} kernel set"
            ),
        )
        for name in names
    ]
