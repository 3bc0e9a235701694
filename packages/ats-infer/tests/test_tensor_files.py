"""tensor_files.py: reading model directories without torch, against safetensors' own writer and
torch's bf16 values, and clear errors on malformed files."""

import json
import os
import re

import numpy as np
import pytest
from ats_infer.model_dir import read_config
from ats_infer.tensor_files import load_tensors
from safetensors.numpy import save_file


def write_dir(tmp_path, tensors: dict[str, np.ndarray]):
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_reads_what_safetensors_wrote(tmp_path) -> None:
    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([-1, 7], dtype=np.int8),
        "c": np.array([[1, 255]], dtype=np.uint8),
        "d": np.array([0.5, -2.0], dtype=np.float16),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    got = load_tensors(write_dir(tmp_path, tensors))
    assert set(got) == set(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        np.testing.assert_array_equal(got[name], t)


def test_bf16_widens_exactly_like_torch(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file as save_torch

    t = torch.randn(5, 6).bfloat16()
    save_torch({"w": t}, str(tmp_path / "model.safetensors"))
    np.testing.assert_array_equal(load_tensors(tmp_path)["w"], t.float().numpy())


@pytest.mark.parametrize(
    ("cut", "message"),
    [(4, "truncated: 4 bytes"), (20, "header length field says"), (-8, "outside the data area")],
)
def test_truncated_files_are_refused(tmp_path, cut, message) -> None:
    write_dir(tmp_path, {"a": np.ones((4, 4), np.float32)})
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(ValueError, match=message):
        load_tensors(tmp_path)


def test_corrupt_headers_and_missing_files_are_refused(tmp_path) -> None:
    header = b'{"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}'
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"x")
    with pytest.raises(ValueError, match="tensor a: dtype 'Q9' is not one of"):
        load_tensors(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors and no"):
        load_tensors(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weights": {}}))
    with pytest.raises(ValueError, match="weight_map = None: expected an object"):
        load_tensors(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        read_config(tmp_path)


def raw_file(tmp_path, header: bytes, data: bytes = b""):
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + data)
    return tmp_path


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        (b'{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, "a": {}}', b"xy", "twice"),
        (
            b'{"a": {"dtype": "U8", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 1]}}',
            b"x",
            "more than 8 dimensions",
        ),
        (b'{"a": {"dtype": "U8", "shape": [true], "data_offsets": [0, 1]}}', b"x", "shape [True]"),
        (b"[" * 100_000 + b"]" * 100_000, b"", "nested too deeply"),
        (b'{"\xff": 1}', b"", "not UTF-8"),
        (b'{"__metadata__": {"k": 1}}', b"", "__metadata__"),
        (b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}', b"xy", "a gap"),
    ],
)
def test_malformed_headers_name_the_problem(tmp_path, header, data, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        load_tensors(raw_file(tmp_path, header, data))


def test_the_data_area_must_be_covered_as_safetensors_requires(tmp_path) -> None:
    from safetensors import SafetensorError, safe_open

    write_dir(tmp_path, {"a": np.ones(4, np.float32)})
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes() + b"\0\0\0\0")
    with pytest.raises(SafetensorError):  # the library's own reader: the reference
        safe_open(str(path), framework="np")
    with pytest.raises(ValueError, match="the tensors cover 16 of the 20 bytes"):
        load_tensors(tmp_path)


def test_an_index_and_its_shards_must_agree(tmp_path) -> None:
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "s1.safetensors"))
    save_file({"b": np.ones(2, np.float32)}, str(tmp_path / "s2.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    assert set(load_tensors(tmp_path)) == {"a", "b"}
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}))
    with pytest.raises(ValueError, match="maps b to s1.safetensors, which does not hold it"):
        load_tensors(tmp_path)
    save_file({"a": np.ones(2, np.float32), "c": np.ones(1, np.uint8)}, str(tmp_path / "s3"))
    index.write_text(json.dumps({"weight_map": {"a": "s3"}}))
    with pytest.raises(ValueError, match="s3: holds c, which model.safetensors.index.json maps"):
        load_tensors(tmp_path)
    index.write_text(json.dumps({"weight_map": {"a": "../s1.safetensors"}}))
    with pytest.raises(ValueError, match="not a plain file name"):
        load_tensors(tmp_path)
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="holds both model.safetensors and"):
        load_tensors(tmp_path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: os.symlink(p.name, p), r"not a model directory \(it is a symlink loop\)"),
        (lambda p: os.symlink("/dev/zero", p), r"\(it is a character device\)"),
        (lambda p: p.write_text("{}"), r"\(it is a file\)"),
    ],
)
def test_what_a_model_path_is_is_said(tmp_path, make, message) -> None:
    path = tmp_path / "model"
    make(path)
    with pytest.raises(ValueError, match=message):
        read_config(path)
