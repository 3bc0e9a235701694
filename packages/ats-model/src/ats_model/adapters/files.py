"""Adapter directories: the adapter's tensors alone, checked against the model before loading.

    dir/adapter_config.json        {"format": "ats-adapter", "format_version", "kind", "base", ...}
    dir/adapter_model.safetensors  kind "lora":    the LoRA tensors (`layers.0.attn.wq.lora_A`, ...)
                                   kind "routers": the MoE router weights (`layers.0.ffn.router.weight`)

"base" records the model's shape (family, dim, n_layer, heads, ffn_dim, vocab, experts): an adapter
for another shape is refused naming the first field that differs. Nothing is unpickled; a
directory is written under a temporary name beside `out` and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ats_model.adapters.lora import (
    LoRAConfig,
    apply_lora,
    is_lora_param,
    lora_state_dict,
    merge_lora,
)
from ats_model.config import ModelConfig
from ats_model.serialization.safetensors_io import parse_json, read_header, require_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_TENSORS = "adapter_model.safetensors"
FORMAT = "ats-adapter"
FORMAT_VERSION = 1
KINDS = ("lora", "routers")


def base_signature(config: ModelConfig) -> dict[str, Any]:
    """The model fields an adapter depends on."""
    return {
        "family": config.family,
        "vocab_size": config.vocab_size,
        "dim": config.dim,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_kv_head": config.n_kv_head,
        "head_dim": config.head_dim,
        "ffn_dim": config.ffn_dim,
        "n_experts": config.moe.n_experts if config.moe is not None else 0,
    }


def router_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The MoE routers' weights, by their names in the model."""
    return adapter_tensors(dict(model.state_dict()), "routers")


def adapter_tensors(state: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """The tensors of a model's state dict that an adapter of `kind` holds."""
    if kind not in KINDS:
        raise ValueError(f"adapter kind {kind!r} is not one of {KINDS}")
    if kind == "lora":
        found = {k: v for k, v in state.items() if is_lora_param(k)}
        if not found:
            raise ValueError("LoRA adapter: the model carries no LoRA adapter")
    else:
        found = {k: v for k, v in state.items() if k.endswith(".router.weight")}
        if not found:
            raise ValueError("router adapter: the model has no MoE router")
    return found


def save_adapter(
    model: nn.Module, out: str | Path, kind: str, lora: LoRAConfig | None = None
) -> Path:
    """Write `model`'s adapter (kind "lora": its LoRA tensors, `lora` their config; kind "routers":
    its router weights) to the directory `out`."""
    tensors = adapter_tensors(dict(model.state_dict()), kind)
    return write_adapter(model.config, tensors, out, kind, lora)


def write_adapter(
    config: ModelConfig,
    tensors: dict[str, torch.Tensor],
    out: str | Path,
    kind: str,
    lora: LoRAConfig | None = None,
) -> Path:
    """Write an adapter directory from its tensors (as adapter_tensors picks them from a state
    dict, gathered by a training backend or not) for a model of `config`."""
    out = Path(out)
    if (kind == "lora") != (lora is not None):
        raise ValueError("write_adapter: a LoRAConfig goes with kind 'lora' only")
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "base": base_signature(config),
    }
    if lora is not None:
        meta["lora"] = lora.to_dict()
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(tensors, tmp / ADAPTER_TENSORS, metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished directory `tmp` to `out`; an existing `out` is replaced only when it
    is an adapter directory (a rerun), never another kind of directory or a file."""
    if out.exists():
        if not (out.is_dir() and (out / ADAPTER_CONFIG).is_file()):
            raise FileExistsError(f"{out} exists and is not an adapter directory; not replacing it")
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)


def read_adapter_config(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / ADAPTER_CONFIG
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not an adapter directory (no such directory)")
    if not path.exists():
        raise FileNotFoundError(f"{directory}: no {ADAPTER_CONFIG} (not an adapter directory)")
    require_file(path)
    meta = parse_json(path.read_bytes(), f"{path}: invalid JSON")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f'{path}: not an ATS adapter config (expected "format": "{FORMAT}")')
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: format_version {meta.get('format_version')!r}, this ATS reads {FORMAT_VERSION}"
        )
    if meta.get("kind") not in KINDS:
        raise ValueError(f"{path}: kind {meta.get('kind')!r} is not one of {KINDS}")
    if not isinstance(meta.get("base"), dict):
        raise ValueError(f'{path}: missing "base" (the model shape the adapter was made for)')
    if meta["kind"] == "lora" and not isinstance(meta.get("lora"), dict):
        raise ValueError(f'{path}: a LoRA adapter needs its "lora" settings')
    return meta


def lora_config_of(meta: dict[str, Any], where: str) -> LoRAConfig:
    settings = dict(meta["lora"])
    try:
        return LoRAConfig(
            rank=settings["rank"],
            alpha=settings["alpha"],
            dropout=settings["dropout"],
            targets=tuple(settings["targets"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f'{where}: bad "lora" settings: {e}') from e


def load_adapter(model: nn.Module, directory: str | Path) -> dict[str, Any]:
    """Apply the adapter in `directory` to `model`, in place (LoRA: adapters added and filled;
    routers: router weights replaced). Returns its adapter_config.json. Shapes and names are
    checked before anything in the model changes."""
    directory = Path(directory)
    meta = read_adapter_config(directory)
    where = str(directory / ADAPTER_CONFIG)
    expected_base = base_signature(model.config)
    for key, value in expected_base.items():
        if meta["base"].get(key) != value:
            raise ValueError(
                f"{where}: adapter made for {key} = {meta['base'].get(key)!r}, "
                f"this model has {key} = {value!r}"
            )
    tensor_path = directory / ADAPTER_TENSORS
    if not tensor_path.exists():
        raise FileNotFoundError(f"{directory}: no {ADAPTER_TENSORS}")
    require_file(tensor_path)
    infos, _ = read_header(tensor_path)
    if meta["kind"] == "lora":
        lora = lora_config_of(meta, where)
        expected = _lora_shapes(model, lora)
    else:
        expected = router_state_dict(model)
    for name, ref in expected.items():
        info = infos.get(name)
        if info is None:
            raise ValueError(f"{tensor_path}: missing tensor {name} (shape {tuple(ref.shape)})")
        if info.shape != tuple(ref.shape):
            raise ValueError(
                f"{tensor_path}: {name} has shape {info.shape}, this model needs {tuple(ref.shape)}"
            )
    extra = sorted(set(infos) - set(expected))
    if extra:
        raise ValueError(f"{tensor_path}: unexpected tensor {extra[0]} (not in this model)")
    with safe_open(str(tensor_path), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in expected}
    if meta["kind"] == "lora":
        apply_lora(model, lora)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in tensors.items():
            params[name].copy_(t)
    return meta


def _lora_shapes(model: nn.Module, lora: LoRAConfig) -> dict[str, torch.Tensor]:
    """The LoRA tensors `lora` would give `model`, found on a meta-device copy (no memory)."""
    from ats_model.build import build_model

    shadow = build_model(model.config, device="meta")
    apply_lora(shadow, lora)
    return lora_state_dict(shadow)


def merge_adapter_into(model: nn.Module, directory: str | Path) -> nn.Module:
    """Load the adapter in `directory` into `model` and merge it: a plain model results."""
    load_adapter(model, directory)
    return merge_lora(model)
