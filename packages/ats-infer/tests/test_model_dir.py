"""model_dir.py: one check of config.json against the tensors for quantize, export-gguf and the
torch engine. Every bad directory here is a copy of a real tiny model with one defect; each must be
refused by all three with a message naming the file, field and value, before anything is written,
and the native loader (the model of these checks) must refuse it too."""

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from ats_infer.engine import load_engine
from ats_infer.gguf_export import export_gguf
from ats_infer.model_dir import open_model_dir, read_config, tensor_layout
from ats_infer.quantize import quantize_model_dir
from ats_infer.tensor_files import load_tensors
from safetensors.numpy import load_file, save_file


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def drop_config_key(directory: Path, key: str) -> None:
    config = json.loads((directory / "config.json").read_text())
    del config[key]
    (directory / "config.json").write_text(json.dumps(config))


def edit_tensors(directory: Path, change: Callable[[dict], None]) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


def edit_header(directory: Path, change: Callable[[dict], None]) -> None:
    """Rewrite the raw safetensors header (data bytes untouched), as a corrupt writer would."""
    path = directory / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    change(header)
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n :])


def entry(name: str, **fields) -> Callable[[dict], None]:
    return lambda header: header[name].update(fields)


def transpose(name: str) -> Callable[[dict], None]:
    return lambda t: t.update({name: np.ascontiguousarray(t[name].T)})


def overlap(header: dict) -> None:
    header["norm.weight"]["data_offsets"] = header["layers.0.ffn_norm.weight"]["data_offsets"]


def symlink_to(target: str) -> Callable[[Path], None]:
    def make(directory: Path) -> None:
        (directory / "model.safetensors").unlink()
        os.symlink(target, directory / "model.safetensors")

    return make


def symlink_loop(directory: Path) -> None:
    (directory / "model.safetensors").unlink()
    os.symlink("loop-b", directory / "model.safetensors")
    os.symlink("model.safetensors", directory / "loop-b")


# (defect, expected words of the message); the model is tiny-dense with an untied head:
# vocab 512, dim 64, 2 layers, 4 heads of 16, 2 KV heads, ffn 128
BAD_DIRS = {
    "missing tensor": (
        lambda d: edit_tensors(d, lambda t: t.pop("layers.1.ffn.w2.weight")),
        "missing tensor layers.1.ffn.w2.weight (shape (64, 128)",
    ),
    "transposed weight": (
        lambda d: edit_tensors(d, transpose("layers.0.ffn.w1.weight")),
        "layers.0.ffn.w1.weight has shape (64, 128), expected (128, 64) from config.json",
    ),
    "unexpected tensor": (
        lambda d: edit_tensors(d, lambda t: t.update(extra=np.zeros(3, np.float32))),
        "unexpected tensor extra",
    ),
    "integer weight": (
        lambda d: edit_tensors(d, lambda t: t.update({"norm.weight": np.ones(64, np.int32)})),
        "norm.weight has dtype I32, expected F32 or BF16 or F16 or F64",
    ),
    "dim disagrees": (
        lambda d: edit_config(d, dim=128),
        "tok_embeddings.weight has shape (512, 64), expected (512, 128)",
    ),
    "n_layer 100000": (
        lambda d: edit_config(d, n_layer=100_000),
        "n_layer = 100000 is invalid: expected an integer >= 1 and <= 4096",
    ),
    "n_layer 3": (
        lambda d: edit_config(d, n_layer=3),
        "n_layer = 3 does not match the tensors",
    ),
    "n_layer 1": (
        lambda d: edit_config(d, n_layer=1),
        "holds layers.0 to layers.1",
    ),
    "n_head 0": (lambda d: edit_config(d, n_head=0), "n_head = 0 is invalid"),
    "n_head string": (lambda d: edit_config(d, n_head="4"), "n_head = '4' is invalid"),
    "rope_theta NaN": (lambda d: edit_config(d, rope_theta=float("nan")), "rope_theta = nan"),
    "huge norm_eps": (lambda d: edit_config(d, norm_eps=10**400, n_head=4), "norm_eps = 1000"),
    "format_version": (lambda d: edit_config(d, format_version=2), "format_version = 2 is"),
    "moe for dense": (lambda d: edit_config(d, moe={}), "moe = {} is invalid: expected null"),
    "missing key": (lambda d: drop_config_key(d, "rope_theta"), "missing key 'rope_theta'"),
    "null ffn_dim": (lambda d: edit_config(d, ffn_dim=None), "ffn_dim = None is invalid"),
    "negative offsets": (
        lambda d: edit_header(d, entry("norm.weight", data_offsets=[-8, 248])),
        "tensor norm.weight: data_offsets [-8, 248] is not [begin, end] of non-negative",
    ),
    "string offsets": (
        lambda d: edit_header(d, entry("norm.weight", data_offsets=["0", "256"])),
        "data_offsets ['0', '256']",
    ),
    "float offsets": (
        lambda d: edit_header(d, entry("norm.weight", data_offsets=[0.0, 256.0])),
        "data_offsets [0.0, 256.0]",
    ),
    "null shape": (
        lambda d: edit_header(d, entry("norm.weight", shape=None)),
        "tensor norm.weight: shape None is not a list of non-negative integers",
    ),
    "overlapping offsets": (lambda d: edit_header(d, overlap), "overlap at byte"),
    "trailing bytes": (
        lambda d: (d / "model.safetensors").write_bytes(
            (d / "model.safetensors").read_bytes() + b"\0" * 4
        ),
        "the tensors cover",
    ),
    "symlink loop": (symlink_loop, "model.safetensors: is a symlink loop"),
    "character device": (
        symlink_to("/dev/zero"),
        "model.safetensors: is a character device, not a regular file",
    ),
}


@pytest.fixture
def bad_dir(request, dense_dir: Path, tmp_path: Path) -> tuple[Path, str]:
    make, message = BAD_DIRS[request.param]
    directory = tmp_path / "model"
    shutil.copytree(dense_dir, directory)
    make(directory)
    return directory, message


CONSUMERS = {
    "quantize": lambda d, out: quantize_model_dir(d, out, 8),
    "export-gguf": lambda d, out: export_gguf(d, out / "m.gguf"),
    "torch engine": lambda d, out: load_engine(d, "torch"),
}


@pytest.mark.parametrize("bad_dir", list(BAD_DIRS), indirect=True)
@pytest.mark.parametrize("consumer", list(CONSUMERS))
def test_bad_directories_are_refused_before_anything_is_written(
    bad_dir: tuple[Path, str], consumer: str, tmp_path: Path
) -> None:
    directory, message = bad_dir
    out = tmp_path / "out"
    with pytest.raises((ValueError, OSError)) as info:
        CONSUMERS[consumer](directory, out)
    assert message in str(info.value)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["model"]


# The native loader does not require the tensors to cover the data area; the safetensors library
# does (checked in test_tensor_files.py), and so do we.
@pytest.mark.parametrize("bad_dir", [k for k in BAD_DIRS if k != "trailing bytes"], indirect=True)
def test_the_native_loader_refuses_them_too(bad_dir: tuple[Path, str]) -> None:
    ats_native = pytest.importorskip("ats_native")
    directory, _ = bad_dir
    with pytest.raises((ValueError, OSError)):
        ats_native.Model(str(directory), threads=1)


def test_the_layout_is_ats_models_state_dict(make_model_dir) -> None:
    """The expected names and shapes equal ats-model's own, for every family (the reference)."""
    import dataclasses

    from ats_model import build_model, presets

    for preset in ("tiny-dense", "tiny-moe", "tiny-mod", "tiny-hybrid"):
        config = presets.get(preset)
        for changes in ({}, {"tie_embeddings": False}):
            if config.moe is not None:
                moe = dataclasses.replace(config.moe, n_shared_experts=1)
                changes = {**changes, "moe": moe}
            model = build_model(dataclasses.replace(config, **changes), device="meta")
            expected = {k: tuple(t.shape) for k, t in model.state_dict().items()}
            as_json = dataclasses.replace(config, **changes).to_dict()
            got = {name: shape for name, shape, _ in tensor_layout(as_json)}
            assert got == expected, preset


@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-hybrid"])
def test_real_directories_open_with_every_tensor(make_model_dir, preset: str) -> None:
    directory = make_model_dir(preset, tie_embeddings=False)
    model = open_model_dir(directory)
    assert model.entries.keys() == load_tensors(directory).keys()
    assert "output.weight" in model.matrices and "layers.1.ffn.router.weight" not in model.matrices
    assert read_config(directory)["n_layer"] == 2


def test_null_head_sizes_resolve_as_ats_model_does(dense_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "model"
    shutil.copytree(dense_dir, directory)
    edit_config(directory, head_dim=None)  # dim 64 / 4 heads = 16, as saved
    assert read_config(directory)["head_dim"] == 16
    open_model_dir(directory)
