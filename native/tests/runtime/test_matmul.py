"""One int8/int4 matmul through the runtime's own path (ats_native.quantized_matmul: repacking,
activation rounding, every kernel set) against a numpy reference of the integer scheme:
activations rounded per 32-block to int8 (llama.cpp's Q8_0: d = max|x| / 127, q = round(x / d)),
exact integer dot products with the weight codes per block, scaled by d and the weight scale.
Both sides round the same inputs with the same fp32 operations, so the codes are identical and
the results differ by fp32 summation order only. Every integer kernel set does the same exact
integer block dots and the same fp32 operations after them (one FMA per block), so each set's
result is bit-identical to the scalar reference's. The runtime's packed copy of an int4 weight
stores its scales as fp16 (native/src/runtime/repack.h), so the reference rounds int4 scales to
fp16 the same way (IEEE round to nearest even: numpy's astype(float16)); int8 row scales stay
fp32."""

import ats_native
import numpy as np
import pytest
from kernel_sets import INTEGER_KERNELS, kernel_params


def q8_0_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (n, C), C % 32 == 0 -> codes (n, C / 32, 32) int64 and block scales d (n, C / 32)."""
    blocks = x.reshape(x.shape[0], -1, 32)  # (n, nb, 32)
    amax = np.abs(blocks).max(-1)  # (n, nb) float32
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(blocks * inv[..., None]), -127, 127)
    return q.astype(np.int64), d


def unpack_q4(codes: np.ndarray) -> np.ndarray:
    """(rows, cols / 2) uint8 -> (rows, cols) int64 weights code - 8 (low nibble = even column)."""
    w = np.empty((codes.shape[0], codes.shape[1] * 2), dtype=np.int64)
    w[:, 0::2] = codes & 0x0F
    w[:, 1::2] = codes >> 4
    return w - 8


def reference(
    codes: np.ndarray, scale: np.ndarray, x: np.ndarray, bits: int, group: int
) -> np.ndarray:
    """The integer scheme in numpy: exact int64 block dots, scales applied in float64; int4
    scales rounded to fp16 first, as the runtime's packed copy holds them."""
    q, d = q8_0_codes(x)
    n, nb, _ = q.shape
    w = codes.astype(np.int64) if bits == 8 else unpack_q4(codes)
    rows = w.shape[0]
    dots = np.einsum("nbk,obk->nob", q, w.reshape(rows, nb, 32))  # (n, rows, nb) exact
    if bits == 8:
        block_scale = np.repeat(scale.astype(np.float64)[:, None], nb, 1)  # (rows, nb)
    else:
        half = scale.astype(np.float16).astype(np.float64)  # the packed copy's fp16 scales
        block_scale = half[:, np.arange(nb) * 32 // group]  # (rows, nb)
    return (dots * d.astype(np.float64)[:, None, :] * block_scale[None]).sum(-1)


def random_weight(
    rng: np.random.Generator, rows: int, cols: int, bits: int, group: int
) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scale) in the layout ats_infer.quantize writes."""
    if bits == 8:
        codes = rng.integers(-127, 128, (rows, cols), dtype=np.int8)
        scale = rng.uniform(0.001, 0.02, rows).astype(np.float32)
    else:
        codes = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
        scale = rng.uniform(0.001, 0.02, (rows, cols // group)).astype(np.float32)
    return codes, scale


# (rows, cols, n): rows % 16 != 0 (partial row groups of the packed layout), odd block counts
# (cols 32, 96, 160, 224), activation rows 1..9 and 17 (kernel calls take up to 8 rows), 17 blocks
# (cols 544: the AVX-512 activation rounding's 16-block step, then one block alone)
SHAPES = [
    (4, 32, 1),
    (5, 64, 3),
    (67, 96, 4),
    (8, 160, 7),
    (130, 1024, 1),
    (12, 1024, 9),
    (16, 224, 2),
    (33, 128, 5),
    (17, 64, 6),
    (48, 96, 8),
    (31, 256, 17),
    (20, 544, 3),
]


# (bits, group, rows, cols, n): every int4 group size on the shapes it divides
CASES = [
    (bits, group, *shape)
    for bits, group in [(8, 32), (4, 32), (4, 64), (4, 128)]
    for shape in SHAPES
    if shape[1] % group == 0
]


@pytest.mark.parametrize("kernels", kernel_params(INTEGER_KERNELS))
@pytest.mark.parametrize(("bits", "group", "rows", "cols", "n"), CASES)
def test_integer_matmul_matches_numpy_reference(
    kernels: str, bits: int, group: int, rows: int, cols: int, n: int
) -> None:
    rng = np.random.default_rng(rows * 1000 + cols + n)
    codes, scale = random_weight(rng, rows, cols, bits, group)
    if bits == 4:  # fp16 subnormal and boundary scales in the packed copy
        scale.flat[0], scale.flat[-1] = 3.3e-6, 6.1e-5
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: d = 0
    x[-1, 5] = 40.0  # an outlier: the rest of its block rounds coarsely
    ref = reference(codes, scale, x, bits, group)
    scalar = ats_native.quantized_matmul(codes, scale, x, bits, group, "scalar", 1)
    for threads in (1, 3):
        y = ats_native.quantized_matmul(codes, scale, x, bits, group, kernels, threads)
        assert y.shape == (n, rows) and y.dtype == np.float32
        assert np.abs(y - ref).max() <= 2e-6 * np.abs(ref).max(), (kernels, threads)
        np.testing.assert_array_equal(y, scalar, err_msg=f"{kernels}, {threads} threads")


@pytest.mark.parametrize("kernels", kernel_params())
def test_int8_rows_of_partial_blocks_use_fp32_activations(kernels: str) -> None:
    """cols = 72 is not whole 32-blocks: the int8 codes meet fp32 activations (a dequantized
    matmul). int4 rows are always whole blocks (groups of 32, 64 or 128 divide them)."""
    rng = np.random.default_rng(7)
    codes, scale = random_weight(rng, 9, 72, 8, 32)
    x = rng.standard_normal((3, 72)).astype(np.float32)
    ref = x.astype(np.float64) @ (codes.astype(np.float64) * scale[:, None]).T
    y = ats_native.quantized_matmul(codes, scale, x, 8, kernels=kernels)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_bad_arguments_raise_clear_errors() -> None:
    rng = np.random.default_rng(0)
    codes, scale = random_weight(rng, 4, 64, 8, 32)
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="bits = 5"):
        ats_native.quantized_matmul(codes, scale, x, 5)
    with pytest.raises(ValueError, match="bytes per row"):
        ats_native.quantized_matmul(codes, scale, np.ones((2, 32), np.float32), 8)
    with pytest.raises(ValueError, match="scale has 3 values"):
        ats_native.quantized_matmul(codes, scale[:3], x, 8)
    with pytest.raises(TypeError, match="int8"):
        ats_native.quantized_matmul(codes.view(np.uint8), scale, x, 8)
    with pytest.raises(ValueError, match="kernels 'sse9' is unknown"):
        ats_native.quantized_matmul(codes, scale, x, 8, kernels="sse9")
    with pytest.raises(ValueError, match="not divisible by group 128"):
        ats_native.quantized_matmul(*random_weight(rng, 4, 64, 4, 32), x, 4, 128)
    with pytest.raises(ValueError, match="n_threads = 0"):
        ats_native.quantized_matmul(codes, scale, x, 8, threads=0)


@pytest.mark.parametrize("kernels", kernel_params(INTEGER_KERNELS))
def test_int4_scale_beyond_fp16_range_is_rejected(kernels: str) -> None:
    """The packed copy holds int4 scales as fp16: a scale it cannot hold is an error, not inf."""
    rng = np.random.default_rng(1)
    codes, scale = random_weight(rng, 4, 64, 4, 32)
    scale[2, 1] = 1e5
    with pytest.raises(ValueError, match="int4 scale 100000.* not a finite fp16 value"):
        ats_native.quantized_matmul(codes, scale, np.ones((1, 64), np.float32), 4, 32, kernels)
