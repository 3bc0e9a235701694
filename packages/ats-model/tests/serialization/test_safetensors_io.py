"""safetensors_io: single-file and sharded round trips in the HF index format, and header checks
that turn truncated or malformed files into errors naming the file."""

import json
import struct

import pytest
import torch
from ats_model.serialization.safetensors_io import (
    INDEX_FILE,
    SINGLE_FILE,
    load_tensors,
    read_header,
    read_tensor_infos,
    write_tensors,
)
from safetensors.torch import load_file


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(16, 8, generator=g),
        "b.weight": torch.randn(32, generator=g).to(torch.bfloat16),
        "c.bias": torch.arange(10, dtype=torch.int64),
        "d.weight": torch.randn(4, 4, 4, generator=g, dtype=torch.float64),
    }


def test_single_file_round_trip_is_bitwise(tmp_path):
    tensors = _tensors()
    files = write_tensors(tmp_path, tensors, {"k": "v"}, max_shard_bytes=1 << 20)
    assert files == [SINGLE_FILE]
    infos, metadata, source = read_tensor_infos(tmp_path)
    assert source == SINGLE_FILE and metadata["k"] == "v"
    assert {k: (i.shape, i.dtype) for k, i in infos.items()} == {
        k: (tuple(t.shape), t.dtype) for k, t in tensors.items()
    }
    loaded = load_tensors(tmp_path, infos)
    assert all(torch.equal(loaded[k], t) for k, t in tensors.items())


def test_sharded_round_trip_writes_hf_index(tmp_path):
    tensors = _tensors()
    files = write_tensors(tmp_path, tensors, {"k": "v"}, max_shard_bytes=580)
    # a: 512 B + b: 64 B fit in 580 B; adding c (80 B) or then d (512 B) would not
    assert files == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        INDEX_FILE,
    ]
    assert not (tmp_path / SINGLE_FILE).exists()
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == 512 + 64 + 80 + 512
    assert index["weight_map"]["a.weight"] == "model-00001-of-00003.safetensors"
    assert index["weight_map"]["d.weight"] == "model-00003-of-00003.safetensors"
    # each shard is a plain safetensors file another reader opens
    shard3 = load_file(str(tmp_path / "model-00003-of-00003.safetensors"))
    assert list(shard3) == ["d.weight"]
    infos, _, source = read_tensor_infos(tmp_path)
    assert source == INDEX_FILE
    loaded = load_tensors(tmp_path, infos)
    assert all(torch.equal(loaded[k], t) for k, t in tensors.items())


def test_resave_replaces_previous_shards(tmp_path):
    write_tensors(tmp_path, _tensors(), {}, max_shard_bytes=580)
    write_tensors(tmp_path, _tensors(), {}, max_shard_bytes=1 << 20)
    assert sorted(p.name for p in tmp_path.iterdir()) == [SINGLE_FILE]


def test_aliased_tensors_are_refused(tmp_path):
    w = torch.randn(4, 4)
    with pytest.raises(ValueError, match="tensors a and b share memory"):
        write_tensors(tmp_path, {"a": w, "b": w}, {}, max_shard_bytes=1 << 20)


def test_truncated_file_is_named(tmp_path):
    write_tensors(tmp_path, _tensors(), {}, max_shard_bytes=1 << 20)
    path = tmp_path / SINGLE_FILE
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"model.safetensors: truncated: [a-d]\.\w+ ends at byte"):
        read_tensor_infos(tmp_path)
    path.write_bytes(data[:20])
    with pytest.raises(ValueError, match=r"model.safetensors: truncated or corrupt: header length"):
        read_header(path)
    path.write_bytes(data[:5])
    with pytest.raises(ValueError, match=r"model.safetensors: truncated: 5 bytes"):
        read_header(path)


def test_corrupt_header_is_named(tmp_path):
    path = tmp_path / SINGLE_FILE
    header = b"{not json"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(ValueError, match="model.safetensors: corrupt header: not JSON"):
        read_header(path)
    header = json.dumps({"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError, match=r"x has data_offsets \[0, 8\] \(8 bytes\) but shape"):
        read_header(path)
    header = json.dumps({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(1))
    with pytest.raises(ValueError, match="x has unsupported dtype 'Q7'"):
        read_header(path)


def test_index_problems_are_named(tmp_path):
    write_tensors(tmp_path, _tensors(), {}, max_shard_bytes=580)
    index_path = tmp_path / INDEX_FILE
    index = json.loads(index_path.read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="maps ghost.weight to model-00001-of-00003.safetensors"):
        read_tensor_infos(tmp_path)
    del index["weight_map"]["ghost.weight"]
    index["weight_map"]["a.weight"] = "model-00002-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="model-00001-of-00003.safetensors: holds a.weight"):
        read_tensor_infos(tmp_path)
    index["weight_map"]["a.weight"] = "model-00001-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors: no such file"):
        read_tensor_infos(tmp_path)
    index_path.unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors and no"):
        read_tensor_infos(tmp_path)


def test_data_area_must_be_tiled_as_safetensors_requires(tmp_path):
    from safetensors import SafetensorError, safe_open

    write_tensors(tmp_path, _tensors(), {}, max_shard_bytes=1 << 20)
    path = tmp_path / SINGLE_FILE
    path.write_bytes(path.read_bytes() + bytes(4))
    with pytest.raises(SafetensorError):  # the library's own reader refuses it: the reference
        safe_open(str(path), framework="pt")
    with pytest.raises(ValueError, match="model.safetensors: the tensors cover 1168 of the 1172"):
        read_header(path)
    header = json.dumps({"x": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(2))
    with pytest.raises(ValueError, match="bytes 0 to 1 belong to no tensor"):
        read_header(path)
    header = b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "x": {}}'
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(1))
    with pytest.raises(ValueError, match="key 'x' appears twice"):
        read_header(path)
