"""An ATS model directory, checked once before anything reads a weight or writes an output, the way
the native loader checks it (native/src/runtime/config.cpp and weights.cpp):

    config.json         every key present, with the JSON type and range the runtime needs
    quantization.json   optional (quant_spec.py); lists matmul weights stored as N.q + N.scale
    tensors             every tensor the config implies, with that exact shape and a supported
                        dtype, and no other (headers checked by tensor_files.py)

quantize, export-gguf and the torch engine all open model directories through `open_model_dir`.
"""

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ats_infer.quant_spec import QUANT_FILE, QUANTO_FILE, read_quantization
from ats_infer.tensor_files import (
    CONFIG_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    TOKENIZER_FILE,
    TensorEntry,
    path_kind,
    read_arrays,
    read_json_object,
    read_tensor_entries,
    require_model_dir,
)

FORMAT_VERSION = 1
FAMILIES = ("dense", "moe", "mod", "hybrid")
MOD_ROUTINGS = ("learned", "static", "random")
MOD_PLACEMENTS = ("all", "later_half", "every_n")
# The native runtime's bounds (config.cpp): sizes its int32 indices hold comfortably.
SIZE_LIMITS = {
    "vocab_size": 2**30,
    "dim": 2**20,
    "n_layer": 4096,
    "n_head": 4096,
    "head_dim": 4096,
    "ffn_dim": 2**22,
    "max_seq_len": 2**24,
}
MAX_ROPE_ENTRIES = 2**28  # max_seq_len * head_dim: the RoPE tables are built for every position
FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
QUANT_DTYPES = {8: "I8", 4: "U8"}
LAYER_NAME = re.compile(r"layers\.(\d+)\.")


class _Fields:
    """Typed reads of one JSON object of config.json; errors name file, key, value, expectation."""

    def __init__(self, data: dict[str, Any], path: Path, prefix: str = "") -> None:
        self.data, self.path, self.prefix = data, path, prefix

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise ValueError(f"{self.path}: missing key {self.prefix + key!r}")
        return self.data[key]

    def bad(self, key: str, expected: str) -> ValueError:
        return ValueError(
            f"{self.path}: {self.prefix}{key} = {self.data[key]!r} is invalid: expected {expected}"
        )

    def integer(self, key: str, low: int | None = 1, high: int | None = None) -> int:
        value = self.get(key)
        if (
            type(value) is not int
            or (low is not None and value < low)
            or (high is not None and value > high)
        ):
            bounds = "" if low is None else f" >= {low}"
            raise self.bad(key, f"an integer{bounds}" + ("" if high is None else f" and <= {high}"))
        return value

    def optional_integer(self, key: str, default: int, high: int | None = None) -> int:
        return default if self.get(key) is None else self.integer(key, 1, high)

    def number(self, key: str, low: float | None = None, strict: bool = True) -> float:
        value = self.get(key)
        try:  # as a double, like every reader of config.json: a 400-digit integer is infinite
            ok = type(value) in (int, float) and math.isfinite(value)
        except OverflowError:
            ok = False
        if ok and low is not None:
            ok = value > low if strict else value >= low
        if not ok:
            bound = "" if low is None else f" {'>' if strict else '>='} {low}"
            raise self.bad(key, f"a finite number{bound}")
        return float(value)

    def boolean(self, key: str) -> bool:
        if type(self.get(key)) is not bool:
            raise self.bad(key, "true or false")
        return self.data[key]

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        if self.get(key) not in choices or type(self.data[key]) is not str:
            raise self.bad(key, f"one of {', '.join(choices)}")
        return self.data[key]

    def sub(self, key: str, wanted: bool, family: str) -> "_Fields | None":
        value = self.get(key)
        if wanted and not isinstance(value, dict):
            raise self.bad(key, f"an object for family {family!r}")
        if not wanted and value is not None:
            raise self.bad(key, f"null for family {family!r}")
        return _Fields(value, self.path, f"{key}.") if wanted else None


def check_config(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """config.json checked as the native runtime checks it; returns it with n_kv_head and
    head_dim resolved where null (n_head, dim // n_head)."""
    f = _Fields(data, path)
    if type(f.get("format_version")) is not int or data["format_version"] != FORMAT_VERSION:
        raise f.bad("format_version", str(FORMAT_VERSION))
    family = f.choice("family", FAMILIES)
    config = dict(data)
    for key in ("vocab_size", "dim", "n_layer", "n_head", "ffn_dim", "max_seq_len"):
        config[key] = f.integer(key, 1, SIZE_LIMITS[key])
    n_head, dim = config["n_head"], config["dim"]
    config["n_kv_head"] = f.optional_integer("n_kv_head", n_head, n_head)
    config["head_dim"] = f.optional_integer("head_dim", dim // n_head, SIZE_LIMITS["head_dim"])
    if n_head % config["n_kv_head"] != 0:
        raise f.bad("n_kv_head", f"a divisor of n_head ({n_head})")
    if config["head_dim"] < 2 or config["head_dim"] % 2 != 0:
        raise ValueError(
            f"{path}: head_dim = {config['head_dim']} is invalid: expected an even integer >= 2 "
            "(RoPE rotates pairs)"
        )
    if config["max_seq_len"] * config["head_dim"] > MAX_ROPE_ENTRIES:
        raise f.bad("max_seq_len", f"max_seq_len * head_dim <= {MAX_ROPE_ENTRIES} (RoPE tables)")
    f.number("rope_theta", 0)
    f.number("norm_eps", 0)
    f.number("init_std")
    f.boolean("tie_embeddings")
    if f.get("rope_scaling") is not None:
        if not isinstance(data["rope_scaling"], dict):
            raise f.bad("rope_scaling", "null or an object")
        s = _Fields(data["rope_scaling"], path, "rope_scaling.")
        s.number("factor", 1, strict=False)
        high = s.number("high_freq_factor", 0)
        s.number("low_freq_factor", 0)
        if not s.data["low_freq_factor"] < high:
            raise s.bad("low_freq_factor", f"< high_freq_factor ({high})")
        s.integer("original_max_seq_len")
    moe = f.sub("moe", family in ("moe", "hybrid"), family)
    if moe is not None:
        n_experts = moe.integer("n_experts", 1, 4096)
        moe.integer("top_k", 1, n_experts)
        if moe.get("capacity_factor") is not None:
            moe.number("capacity_factor", 0)
        moe.number("router_temperature", 0)
        moe.boolean("norm_topk")
        moe.integer("n_shared_experts", 0, 64)
        moe.number("bias_update_rate", 0, strict=False)
    mod = f.sub("mod", family in ("mod", "hybrid"), family)
    if mod is not None:
        capacity = mod.number("capacity", 0)
        if capacity > 1:
            raise mod.bad("capacity", "a number in (0, 1]")
        mod.choice("routing", MOD_ROUTINGS)
        mod.choice("placement", MOD_PLACEMENTS)
        mod.integer("every_n")
        mod.integer("predictor_dim", 1, SIZE_LIMITS["dim"])
        mod.integer("seed", None)
    return config


def _routes(mod: dict[str, Any], i: int, n_layer: int) -> bool:
    """Whether block i is a Mixture-of-Depths block (ats_model's MoDConfig.routes_layer)."""
    if mod["placement"] == "all":
        return True
    if mod["placement"] == "later_half":
        return i >= n_layer // 2
    return i % mod["every_n"] == mod["every_n"] - 1


def tensor_layout(config: dict[str, Any]) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, is_matmul_weight) of every float tensor a checked config implies, in the
    native loader's order (weights.cpp); the matmul weights are what int8/int4 quantize."""
    V, C, F = config["vocab_size"], config["dim"], config["ffn_dim"]
    H = config["n_head"] * config["head_dim"]
    KV = config["n_kv_head"] * config["head_dim"]
    moe, mod = config["moe"], config["mod"]
    yield "tok_embeddings.weight", (V, C), False
    yield "norm.weight", (C,), False
    for i in range(config["n_layer"]):
        p = f"layers.{i}."
        yield p + "attn_norm.weight", (C,), False
        yield p + "ffn_norm.weight", (C,), False
        yield p + "attn.wq.weight", (H, C), True
        yield p + "attn.wk.weight", (KV, C), True
        yield p + "attn.wv.weight", (KV, C), True
        yield p + "attn.wo.weight", (C, H), True
        if moe is None:
            yield p + "ffn.w1.weight", (F, C), True
            yield p + "ffn.w3.weight", (F, C), True
            yield p + "ffn.w2.weight", (C, F), True
        else:
            E, S = moe["n_experts"], moe["n_shared_experts"] * F
            yield p + "ffn.router.weight", (E, C), False
            yield p + "ffn.expert_bias", (E,), False
            yield p + "ffn.experts.w1", (E, F, C), True
            yield p + "ffn.experts.w3", (E, F, C), True
            yield p + "ffn.experts.w2", (E, C, F), True
            if S > 0:
                yield p + "ffn.shared.w1.weight", (S, C), True
                yield p + "ffn.shared.w3.weight", (S, C), True
                yield p + "ffn.shared.w2.weight", (C, S), True
        if mod is not None and mod["routing"] == "learned" and _routes(mod, i, config["n_layer"]):
            P = mod["predictor_dim"]
            yield p + "mod_router.weight", (1, C), False
            yield p + "mod_predictor.w_in.weight", (P, C), False
            yield p + "mod_predictor.w_out.weight", (1, P), False
    if not config["tie_embeddings"]:
        yield "output.weight", (V, C), True


def _stored_layout(
    name: str, shape: tuple[int, ...], quant: dict[str, Any] | None, quant_path: Path
) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
    """(name, shape, allowed dtypes) of the stored tensor(s) standing for the model tensor
    `name`: itself in float, or N.q + N.scale where quantization.json lists it."""
    if quant is None or name not in quant["quantized"]:
        return [(name, shape, FLOAT_DTYPES)]
    bits, group = quant["bits"], quant["group_size"]
    if bits == 8:
        return [(name + ".q", shape, ("I8",)), (name + ".scale", shape[:-1], ("F32",))]
    if shape[-1] % group != 0:
        raise ValueError(
            f"{quant_path}: {name} has rows of {shape[-1]}, not divisible by group_size {group}"
        )
    return [
        (name + ".q", (*shape[:-1], shape[-1] // 2), ("U8",)),
        (name + ".scale", (*shape[:-1], shape[-1] // group), ("F32",)),
    ]


def check_tensors(
    model_dir: Path,
    config: dict[str, Any],
    quant: dict[str, Any] | None,
    entries: dict[str, TensorEntry],
) -> tuple[str, ...]:
    """Raise on the first tensor missing, misshapen, of an unsupported dtype or unexpected, as
    weights.cpp does; returns the names of the model's matmul weights."""
    single = model_dir / SINGLE_FILE
    source = single if path_kind(single) != "missing" else model_dir / INDEX_FILE
    layers = {int(m.group(1)) for name in entries if (m := LAYER_NAME.match(name))}
    n_layer, held = config["n_layer"], max(layers, default=-1) + 1
    # fewer layers, or a whole other number of them (a stray layers.9.x is an unexpected tensor)
    if held < n_layer or (held != n_layer and layers == set(range(held))):
        holds = f"layers.0 to layers.{held - 1}" if layers else "no layers"
        raise ValueError(
            f"{model_dir / CONFIG_FILE}: n_layer = {n_layer} does not match the tensors: "
            f"{source} holds {holds}"
        )
    quant_path = model_dir / QUANT_FILE
    if quant is not None:
        quant = {**quant, "quantized": set(quant["quantized"])}
    matrices, used = [], set()
    for model_name, model_shape, matrix in tensor_layout(config):
        if matrix:
            matrices.append(model_name)
        elif quant is not None and model_name in quant["quantized"]:
            raise ValueError(f"{quant_path}: lists {model_name}, which is not a matmul weight")
        for name, shape, dtypes in _stored_layout(model_name, model_shape, quant, quant_path):
            entry = entries.get(name)
            if entry is None:
                raise ValueError(
                    f"{source}: missing tensor {name} (shape {shape}, expected from {CONFIG_FILE})"
                )
            if entry.shape != shape:
                raise ValueError(
                    f"{entry.file}: {name} has shape {entry.shape}, expected {shape} from "
                    f"{CONFIG_FILE}"
                )
            if entry.dtype not in dtypes:
                raise ValueError(
                    f"{entry.file}: {name} has dtype {entry.dtype}, expected {' or '.join(dtypes)}"
                )
            used.add(name)
    for name, entry in entries.items():
        if name not in used:
            raise ValueError(
                f"{entry.file}: unexpected tensor {name} (not in the model {CONFIG_FILE} describes)"
            )
    if quant is not None:
        for name in sorted(quant["quantized"] - set(matrices)):
            raise ValueError(
                f"{quant_path}: lists {name}, which is not a matmul weight of this model"
            )
    return tuple(sorted(matrices))


@dataclass(frozen=True)
class ModelDir:
    """A checked model directory: reading its tensors cannot meet a surprise."""

    path: Path
    config: dict[str, Any]  # config.json, checked; n_kv_head and head_dim resolved where null
    quantization: dict[str, Any] | None  # quantization.json, or None for a float directory
    entries: dict[str, TensorEntry]
    matrices: tuple[str, ...]  # the matmul weights, sorted (int8/int4 quantize these)

    def tensors(self) -> dict[str, np.ndarray]:
        return read_arrays(self.entries)

    def files(self) -> list[Path]:
        """The files this directory's model is read from (outputs must never replace them)."""
        names = [CONFIG_FILE, TOKENIZER_FILE, QUANT_FILE, INDEX_FILE]
        present = [self.path / n for n in names if path_kind(self.path / n) != "missing"]
        return [*present, *sorted({e.file for e in self.entries.values()})]


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of model directory `path`, checked (see check_config)."""
    path = Path(path)
    require_model_dir(path)
    return check_config(read_json_object(path / CONFIG_FILE), path / CONFIG_FILE)


def open_model_dir(path: str | Path) -> ModelDir:
    """Read and check config.json, quantization.json and every tensor header of `path`."""
    path = Path(path)
    config = read_config(path)
    if path_kind(path / QUANTO_FILE) != "missing":
        raise ValueError(
            f"{path}: is an optimum-quanto directory ({QUANTO_FILE}), already quantized; only "
            "the torch engine reads it: quantize or export the float directory"
        )
    quant = read_quantization(path)
    entries = read_tensor_entries(path)
    return ModelDir(path, config, quant, entries, check_tensors(path, config, quant, entries))
