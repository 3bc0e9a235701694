"""ats_native.cpu_peak (the benchmark's compute ceiling): a positive rate for both kinds on a CPU
with AVX2, clear errors for bad arguments. (Rates are machine- and load-dependent: no timed
asserts.)"""

import ats_native
import pytest

x86_simd = pytest.mark.skipif(
    not (ats_native.cpu_features()["avx2"] and ats_native.cpu_features()["fma"]),
    reason="cpu_peak needs AVX2+FMA or AVX-512",
)


@x86_simd
@pytest.mark.parametrize("kind", ["int8", "fp32"])
def test_peak_is_a_positive_rate(kind: str) -> None:
    rate = ats_native.cpu_peak(kind, threads=1, seconds=0.02)
    assert rate > 1e8  # any AVX2 core does well over 0.1 G multiply-adds/s


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="kind 'int4' is unknown: expected int8 or fp32"):
        ats_native.cpu_peak("int4")
    if ats_native.cpu_features()["avx2"]:
        with pytest.raises(ValueError, match="threads = 0"):
            ats_native.cpu_peak("int8", threads=0)
        with pytest.raises(ValueError, match="expected threads >= 1 and 0 < seconds <= 60"):
            ats_native.cpu_peak("fp32", seconds=0.0)
