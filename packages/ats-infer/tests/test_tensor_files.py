"""tensor_files.py: reading model directories without torch, against safetensors' own writer and
torch's bf16 values, and clear errors on malformed files."""

import json

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
