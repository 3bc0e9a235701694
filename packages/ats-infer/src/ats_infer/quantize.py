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
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ats_infer.model_dir import ModelDir, open_model_dir
from ats_infer.output_paths import new_directory
from ats_infer.quant_spec import QUANT_FILE, check_scheme, quant_spec
from ats_infer.quant_spec import read_quantization as read_quantization  # re-exported
from ats_infer.tensor_files import CONFIG_FILE, SINGLE_FILE, TOKENIZER_FILE, path_kind


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


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """Signed codes (..., out, in) in -8..7 -> uint8 (..., out, in / 2), low nibble = even j."""
    biased = (codes.astype(np.int16) + 8).astype(np.uint8)
    pairs = biased.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)  # pairs j, j+1
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def quantize_int4(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """w (..., out, in) -> (packed uint8 (..., out, in/2), scale float32 (..., out, in/group))."""
    check_scheme(4, group_size)
    w = np.asarray(w, dtype=np.float32)
    n_in = w.shape[-1]
    if n_in % group_size != 0:
        raise ValueError(f"row length {n_in} is not divisible by group_size {group_size}")
    groups = w.reshape(*w.shape[:-1], n_in // group_size, group_size)  # (..., out, G, gs)
    scale = (np.abs(groups).max(axis=-1) / np.float32(7)).astype(np.float32)  # (..., out, G)
    codes = _codes(groups, scale[..., None], -8, 7).reshape(w.shape)  # (..., out, in)
    return pack_int4(codes), scale


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


def dequantize_tensors(model_dir: str | Path) -> dict[str, np.ndarray]:
    """The float state dict a quantized directory stands for (float directories load as they are)."""
    model = open_model_dir(model_dir)
    tensors = model.tensors()
    spec = model.quantization
    if spec is None:
        return tensors
    out = {k: v for k, v in tensors.items() if not k.endswith((".q", ".scale"))}
    for name in spec["quantized"]:
        q, scale = tensors[name + ".q"], tensors[name + ".scale"]
        out[name] = dequantize(q, scale, spec["bits"], spec["group_size"])
    return out


def check_quantizable(model: ModelDir, bits: int, group_size: int | None) -> None:
    """Raise unless the float directory `model` can be quantized in this scheme."""
    check_scheme(bits, group_size)
    if model.quantization is not None:
        raise ValueError(
            f"{model.path}: already quantized ({QUANT_FILE}); quantize the float directory"
        )
    if bits == 4:
        for name in model.matrices:
            n_in = model.entries[name].shape[-1]
            if n_in % group_size != 0:
                raise ValueError(
                    f"{model.path}: {name} has rows of {n_in} elements, not divisible by "
                    f"group_size {group_size}; choose a group size dividing {n_in}"
                )


def write_quantized_dir(
    model: ModelDir,
    out: Path,
    spec: dict,
    quantized: Callable[[str, np.ndarray], tuple[np.ndarray, np.ndarray]],
    force: bool,
) -> Path:
    """Write model directory `out`: spec as quantization.json, every matmul weight N as
    quantized(N, w) = (N.q, N.scale), every other tensor as F32, config and tokenizer copied."""
    with new_directory(out, [model.path, *model.files()], force) as tmp:
        matrices = set(model.matrices)
        result: dict[str, np.ndarray] = {}
        for name, w in model.tensors().items():
            if name not in matrices:
                result[name] = np.ascontiguousarray(w, dtype=np.float32)
                continue
            result[name + ".q"], result[name + ".scale"] = quantized(name, w)
        save_file(result, str(tmp / SINGLE_FILE), metadata={"format": "np"})
        (tmp / QUANT_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        shutil.copyfile(model.path / CONFIG_FILE, tmp / CONFIG_FILE)
        if path_kind(model.path / TOKENIZER_FILE) != "missing":
            shutil.copyfile(model.path / TOKENIZER_FILE, tmp / TOKENIZER_FILE)
    return out


def quantize_model_dir(
    src: str | Path,
    out: str | Path,
    bits: int,
    group_size: int | None = None,
    *,
    force: bool = False,
) -> Path:
    """Write the round-to-nearest quantized copy of model directory `src` as the new directory
    `out` (config.json and tokenizer.json copied, quantization.json + model.safetensors written);
    an existing non-empty `out` only with `force`, never over `src`. Returns `out`."""
    model = open_model_dir(src)
    check_quantizable(model, bits, group_size)

    def rtn(name: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return quantize_int8(w) if bits == 8 else quantize_int4(w, group_size)

    spec = quant_spec(bits, group_size, list(model.matrices), "rtn")
    return write_quantized_dir(model, Path(out), spec, rtn, force)
