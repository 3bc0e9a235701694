"""Weight-only symmetric quantization of an ATS model directory (numpy only), in the layout that
the native runtime reads:

    int8: per output channel, scale = max|row| / 127, q = clamp(round(w / scale), -127, 127) (I8)
    int4: per group of `group_size` inputs, scale = max|group| / 7,
          c = clamp(round(w / scale), -8, 7) + 8, two codes per byte, element j of a row in byte
          j // 2, the LOW nibble for even j (U8 of shape (..., out, in / 2))

A weight N of shape (..., out, in) becomes N.q and N.scale; w = q * scale (int8) or
(c - 8) * scale (int4). `dequantize` is the reference the native int8/int4 kernels are tested
against. Only matmul weights are quantized; embeddings, norms, routers and MoD predictors stay F32.
"""

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from ats_infer.tensor_files import (
    CONFIG_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    TOKENIZER_FILE,
    load_tensors,
    read_config,
)

QUANT_FILE = "quantization.json"
FORMAT_VERSION = 1
BITS = (8, 4)
GROUP_SIZES = (32, 64, 128)
# Every matmul weight: attention, dense FFN, stacked experts (E, out, in), shared experts, LM head.
QUANTIZED_NAME = re.compile(
    r"layers\.\d+\.attn\.w[qkvo]\.weight"
    r"|layers\.\d+\.ffn\.w[123]\.weight"
    r"|layers\.\d+\.ffn\.experts\.w[123]"
    r"|layers\.\d+\.ffn\.shared\.w[123]\.weight"
    r"|output\.weight"
)


def is_quantized_name(name: str) -> bool:
    return QUANTIZED_NAME.fullmatch(name) is not None


def check_scheme(bits: int, group_size: int | None) -> None:
    if bits not in BITS:
        raise ValueError(f"bits = {bits!r} is not supported: expected 8 or 4")
    if bits == 8 and group_size is not None:
        raise ValueError(f"group_size = {group_size} is for int4; int8 is per output channel")
    if bits == 4 and group_size not in GROUP_SIZES:
        raise ValueError(
            f"group_size = {group_size!r} is not supported for int4: expected 32, 64 or 128"
        )


def _codes(w: np.ndarray, scale: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """clamp(round(w / scale), lo, hi) with scale broadcast over w's last axis; scale 0 gives 0."""
    safe = np.where(scale == 0, np.float32(1), scale)
    return np.clip(np.rint(w / safe), lo, hi)


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (..., out, in) -> (q int8 (..., out, in), scale float32 (..., out))."""
    w = np.asarray(w, dtype=np.float32)
    scale = (np.abs(w).max(axis=-1) / np.float32(127)).astype(np.float32)  # (..., out)
    q = _codes(w, scale[..., None], -127, 127).astype(np.int8)
    return q, scale


def quantize_int4(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """w (..., out, in) -> (packed uint8 (..., out, in/2), scale float32 (..., out, in/group))."""
    check_scheme(4, group_size)
    w = np.asarray(w, dtype=np.float32)
    n_in = w.shape[-1]
    if n_in % group_size != 0:
        raise ValueError(f"row length {n_in} is not divisible by group_size {group_size}")
    groups = w.reshape(*w.shape[:-1], n_in // group_size, group_size)  # (..., out, G, gs)
    scale = (np.abs(groups).max(axis=-1) / np.float32(7)).astype(np.float32)  # (..., out, G)
    codes = (_codes(groups, scale[..., None], -8, 7) + 8).astype(np.uint8)  # (..., out, G, gs)
    codes = codes.reshape(*w.shape[:-1], n_in // 2, 2)  # (..., out, in/2, 2): pairs j, j+1
    packed = codes[..., 0] | (codes[..., 1] << 4)  # even j in the low nibble
    return packed.astype(np.uint8), scale


def dequantize(
    q: np.ndarray, scale: np.ndarray, bits: int, group_size: int | None = None
) -> np.ndarray:
    """The reference inverse: float32 weights (..., out, in) from N.q and N.scale."""
    check_scheme(bits, group_size)
    if bits == 8:
        if q.dtype != np.int8 or scale.shape != q.shape[:-1]:
            raise ValueError(
                f"int8: expected q int8 (..., out, in) and scale (..., out), got q {q.dtype} "
                f"{q.shape} and scale {scale.shape}"
            )
        return q.astype(np.float32) * scale[..., None].astype(np.float32)
    n_in = q.shape[-1] * 2
    if q.dtype != np.uint8 or scale.shape != (*q.shape[:-1], n_in // group_size):
        raise ValueError(
            f"int4: expected q uint8 (..., out, in/2) and scale (..., out, in/{group_size}), got q "
            f"{q.dtype} {q.shape} and scale {scale.shape}"
        )
    codes = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(*q.shape[:-1], n_in)  # (..., out, in)
    values = codes.astype(np.float32) - np.float32(8)
    groups = values.reshape(*q.shape[:-1], n_in // group_size, group_size)  # (..., out, G, gs)
    return (groups * scale[..., None].astype(np.float32)).reshape(values.shape)


def read_quantization(model_dir: Path) -> dict[str, Any] | None:
    """quantization.json of a model directory (validated), or None for a float directory."""
    path = Path(model_dir) / QUANT_FILE
    if not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON: {err}") from None
    for key in ("format_version", "bits", "group_size", "scheme", "quantized"):
        if key not in spec:
            raise ValueError(f"{path}: missing key {key!r}")
    if spec["format_version"] != FORMAT_VERSION or spec["scheme"] != "symmetric":
        raise ValueError(
            f"{path}: format_version {spec['format_version']!r} / scheme {spec['scheme']!r} is "
            f"not supported: expected {FORMAT_VERSION} / 'symmetric'"
        )
    check_scheme(spec["bits"], spec["group_size"])
    return spec


def dequantize_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    """The float state dict a quantized directory stands for (float directories load as they are)."""
    tensors = load_tensors(model_dir)
    spec = read_quantization(model_dir)
    if spec is None:
        return tensors
    out = {k: v for k, v in tensors.items() if not k.endswith((".q", ".scale"))}
    for name in spec["quantized"]:
        q, scale = tensors.get(name + ".q"), tensors.get(name + ".scale")
        if q is None or scale is None:
            raise ValueError(
                f"{model_dir}: {QUANT_FILE} lists {name} but {name}.q/.scale are missing"
            )
        out[name] = dequantize(q, scale, spec["bits"], spec["group_size"])
    return out


def quantize_model_dir(
    src: str | Path, out: str | Path, bits: int, group_size: int | None = None
) -> Path:
    """Write the quantized copy of model directory `src` to `out` (config.json and tokenizer.json
    copied, quantization.json + model.safetensors written). Returns `out`."""
    check_scheme(bits, group_size)
    src, out = Path(src), Path(out)
    read_config(src)
    if read_quantization(src) is not None:
        raise ValueError(f"{src}: already quantized ({QUANT_FILE}); quantize the float directory")
    if out.resolve() == src.resolve():
        raise ValueError(f"--out {out} is the source directory; choose a new directory")
    tensors = load_tensors(src)
    names = sorted(n for n in tensors if is_quantized_name(n))
    quantized = set(names)
    if not names:
        raise ValueError(f"{src}: no matmul weights found to quantize (is this an ATS model?)")
    result: dict[str, np.ndarray] = {}
    for name, w in tensors.items():
        if name not in quantized:
            result[name] = np.ascontiguousarray(w, dtype=np.float32)
            continue
        if w.dtype.kind != "f" or w.ndim < 2:
            raise ValueError(f"{src}: {name} is {w.dtype} {w.shape}; expected a float matrix")
        if bits == 4 and w.shape[-1] % group_size != 0:
            raise ValueError(
                f"{src}: {name} has rows of {w.shape[-1]} elements, not divisible by "
                f"group_size {group_size}; choose a group size dividing {w.shape[-1]}"
            )
        q, scale = quantize_int8(w) if bits == 8 else quantize_int4(w, group_size)
        result[name + ".q"], result[name + ".scale"] = q, scale
    out.mkdir(parents=True, exist_ok=True)
    if (out / INDEX_FILE).exists():
        raise ValueError(f"{out}: holds a sharded model ({INDEX_FILE}); choose a new directory")
    save_file(result, str(out / SINGLE_FILE), metadata={"format": "np"})
    spec = {
        "format_version": FORMAT_VERSION,
        "bits": bits,
        "group_size": group_size,
        "scheme": "symmetric",
        "quantized": names,
    }
    (out / QUANT_FILE).write_text(json.dumps(spec, indent=2) + "\n")
    shutil.copyfile(src / CONFIG_FILE, out / CONFIG_FILE)
    if (src / TOKENIZER_FILE).is_file():
        shutil.copyfile(src / TOKENIZER_FILE, out / TOKENIZER_FILE)
    return out
