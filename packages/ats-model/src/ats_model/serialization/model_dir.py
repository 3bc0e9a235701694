"""The ATS model directory (ARCHITECTURE.md section 4): save_pretrained / load_pretrained.

    dir/config.json                       ModelConfig.to_dict() (carries "format_version")
    dir/model.safetensors                 the state dict, or shards + model.safetensors.index.json
    dir/tokenizer.json                    optional, copied as given

Loading checks names, shapes and dtypes against a model built from config.json and names the first
mismatch; nothing is unpickled.
"""

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from ats_model.build import build_model
from ats_model.config import MoDConfig, ModelConfig, MoEConfig, RopeScaling
from ats_model.serialization.safetensors_io import (
    TensorInfo,
    load_tensors,
    parse_json,
    path_kind,
    read_tensor_infos,
    require_file,
    write_tensors,
)

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30
# The safetensors header metadata key recording the dtype the model was saved in (config.json is
# architecture only, so the checkpoint itself says what precision its tensors should have).
DTYPE_KEY = "ats_dtype"


MODEL_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str, where: str) -> torch.dtype:
    if name not in MODEL_DTYPES:
        raise ValueError(f"{where}: dtype {name!r} is not one of {sorted(MODEL_DTYPES)}")
    return MODEL_DTYPES[name]


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating dtype of the model's parameters; mixed float parameters are refused."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(dtypes) != 1:
        raise ValueError(f"model parameters have dtypes {sorted(map(str, dtypes))}; expected one")
    return dtypes.pop()


def copy_tokenizer(tokenizer_json: str | Path | None, directory: Path) -> None:
    if tokenizer_json is None:
        return
    src = Path(tokenizer_json)
    if not src.is_file():
        raise FileNotFoundError(f"tokenizer_json: no such file {src}")
    if src.resolve() != (directory / TOKENIZER_FILE).resolve():
        shutil.copyfile(src, directory / TOKENIZER_FILE)


def save_pretrained(
    model: torch.nn.Module,
    directory: str | Path,
    tokenizer_json: str | Path | None = None,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Write `model` as an ATS model directory; shards above `max_shard_bytes`. Returns the dir."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config: ModelConfig = model.config
    (directory / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    metadata = {"format": "pt", DTYPE_KEY: dtype_name(model_dtype(model))}
    write_tensors(directory, dict(model.state_dict()), metadata, max_shard_bytes)
    copy_tokenizer(tokenizer_json, directory)
    return directory


def _require_fields(
    data: dict[str, Any], cls: type, prefix: str, extra: tuple[str, ...] = ()
) -> None:
    for key in [*extra, *(f.name for f in dataclasses.fields(cls))]:
        if key not in data:
            raise ValueError(f"{CONFIG_FILE}: missing key {prefix + key!r}")


def read_config_json(directory: Path) -> dict[str, Any]:
    """config.json as a dict; absence, bad JSON or a non-object name the file."""
    kind = path_kind(directory)
    if kind == "missing":
        raise FileNotFoundError(f"{directory}: not a model directory (no such directory)")
    if kind != "directory":
        raise ValueError(f"{directory}: not a model directory (it is a {kind})")
    path = directory / CONFIG_FILE
    if path_kind(path) == "missing":
        raise FileNotFoundError(f"{directory}: no {CONFIG_FILE}")
    require_file(path)
    data = parse_json(path.read_bytes(), f"{CONFIG_FILE}: invalid JSON")
    if not isinstance(data, dict):
        raise ValueError(f"{CONFIG_FILE}: expected a JSON object, got {type(data).__name__}")
    return data


def read_config(directory: Path) -> ModelConfig:
    """config.json -> ModelConfig; missing or unknown keys and bad JSON name the file and key."""
    data = read_config_json(directory)
    # Every field must be present: a default silently filling a missing key would load a
    # different architecture than the one that was saved.
    _require_fields(data, ModelConfig, "", extra=("format_version",))
    for key, sub in (("rope_scaling", RopeScaling), ("moe", MoEConfig), ("mod", MoDConfig)):
        if isinstance(data[key], dict):
            _require_fields(data[key], sub, f"{key}.")
    try:
        return ModelConfig.from_dict(data)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{CONFIG_FILE}: {e}") from e


def check_tensors(
    found: dict[str, TensorInfo], expected: dict[str, torch.Tensor], source: str, origin: str
) -> None:
    """Raise on the first name, shape or dtype in `found` that differs from `expected`."""
    for key, ref in expected.items():
        info = found.get(key)
        if info is None:
            raise ValueError(
                f"{source}: missing tensor {key} (shape {tuple(ref.shape)}, expected from {origin})"
            )
        if info.shape != tuple(ref.shape):
            raise ValueError(
                f"{info.file}: {key} has shape {info.shape}, expected {tuple(ref.shape)} from {origin}"
            )
        if info.dtype != ref.dtype:
            raise ValueError(
                f"{info.file}: {key} has dtype {dtype_name(info.dtype)}, "
                f"expected {dtype_name(ref.dtype)}"
            )
    for key, info in found.items():
        if key not in expected:
            raise ValueError(
                f"{info.file}: unexpected tensor {key} (not in the model from {origin})"
            )


LAYER_KEY = re.compile(r"(?:model\.)?layers\.(\d+)\.")  # ATS and HF names


def check_layer_count(found: dict[str, TensorInfo], n_layer: int, source: str) -> None:
    """config.json's n_layer against the layers the tensors hold, before a model of n_layer
    blocks is built to compare shapes with (which takes minutes for a corrupt n_layer = 100000)."""
    layers = {int(m.group(1)) for key in found if (m := LAYER_KEY.match(key))}
    held = max(layers, default=-1) + 1
    # fewer layers, or a whole other number of them (a stray layers.9.x is an unexpected tensor)
    if held < n_layer or (held != n_layer and layers == set(range(held))):
        holds = f"layers.0 to layers.{held - 1}" if layers else "no layers"
        raise ValueError(
            f"{CONFIG_FILE}: n_layer = {n_layer} does not match the tensors: {source} holds {holds}"
        )


def load_pretrained(
    directory: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    kernels: str = "auto",
) -> torch.nn.Module:
    """Build the model config.json describes and load its tensors; `dtype=None` keeps the saved one."""
    directory = Path(directory)
    config = read_config(directory)
    infos, metadata, source = read_tensor_infos(directory)
    if DTYPE_KEY not in metadata:
        raise ValueError(
            f"{source}: header metadata lacks {DTYPE_KEY!r} (written by save_pretrained)"
        )
    saved_dtype = parse_dtype(metadata[DTYPE_KEY], f"{source}: metadata {DTYPE_KEY}")
    check_layer_count(infos, config.n_layer, source)
    # Validate against a shapes-only (meta) model in the saved dtype before allocating anything.
    expected = build_model(config, device="meta", dtype=saved_dtype, kernels=kernels).state_dict()
    check_tensors(infos, dict(expected), source, CONFIG_FILE)
    model = build_model(config, device=device, dtype=dtype or saved_dtype, kernels=kernels)
    model.load_state_dict(load_tensors(directory, infos), strict=True)  # casts to `dtype`
    return model
