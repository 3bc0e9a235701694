"""Malformed model directories and bad arguments give a Python exception with a clear message,
never a crash. Loading runs in a subprocess so a crash (a signal) fails the test instead of
killing pytest."""

import json
import random
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import ats_native
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file


def load_in_subprocess(directory: Path) -> str:
    """Loads `directory` with ats_native.Model in a fresh interpreter; returns the error message
    (empty if it loaded). Fails the test if the interpreter died from a signal."""
    code = textwrap.dedent(
        f"""
        import ats_native
        try:
            ats_native.Model({str(directory)!r}, threads=1).logits([1, 2, 3])
        except (ValueError, OSError) as e:
            print("ERROR:", e)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"crashed with {proc.returncode}: {proc.stderr[-2000:]}"
    out = proc.stdout.strip()
    return out.removeprefix("ERROR: ") if out.startswith("ERROR:") else ""


def raw_safetensors(path: Path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


@pytest.fixture
def model_copy(saved_model, tmp_path: Path) -> Path:
    _, directory = saved_model("tiny-dense")
    dst = tmp_path / "model"
    shutil.copytree(directory, dst)
    return dst


def test_intact_copy_loads(model_copy: Path) -> None:
    assert load_in_subprocess(model_copy) == ""


@pytest.mark.parametrize("keep", [0, 5, 8, 100, -1000])
def test_truncated_safetensors(model_copy: Path, keep: int) -> None:
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    msg = load_in_subprocess(model_copy)
    assert "model.safetensors" in msg and ("truncated" in msg or "outside the data area" in msg), (
        msg
    )


def test_random_byte_flips_in_header_never_crash(model_copy: Path) -> None:
    path = model_copy / "model.safetensors"
    original = path.read_bytes()
    (header_len,) = struct.unpack("<Q", original[:8])
    code = textwrap.dedent(
        f"""
        import random, ats_native
        from pathlib import Path
        path = Path({str(path)!r})
        original = path.read_bytes()
        rng = random.Random(0)
        errors = 0
        for trial in range(150):
            data = bytearray(original)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(0, 8 + {header_len})] = rng.randrange(256)
            path.write_bytes(bytes(data))
            try:
                ats_native.Model({str(model_copy)!r}, threads=1)
            except ValueError as e:
                assert "model.safetensors" in str(e), str(e)
                errors += 1
        print(errors)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"crashed with {proc.returncode}: {proc.stderr[-2000:]}"
    assert int(proc.stdout) > 50  # most flips break the header and are reported


def header_and_data(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda e: e.update(data_offsets=[0, 10**12]), "outside the data area"),
        (lambda e: e.update(data_offsets=[8, 4]), "outside the data area"),
        (lambda e: e.update(shape=[2**40, 2**40, 2**40]), "too large"),
        (lambda e: e.update(shape=[-1, 64]), "non-negative"),
        (lambda e: e.update(dtype="Q7"), "unknown dtype"),
        (lambda e: e.update(shape=[64, 65]), "need"),
        (lambda e: e.pop("data_offsets"), "data_offsets"),
    ],
)
def test_corrupt_header_entries(model_copy: Path, edit, expected: str) -> None:
    path = model_copy / "model.safetensors"
    header, data = header_and_data(path)
    edit(header["layers.0.attn.wq.weight"])
    raw_safetensors(path, header, data)
    msg = load_in_subprocess(model_copy)
    assert expected in msg and "layers.0.attn.wq.weight" in msg, msg


def test_overlapping_tensors(model_copy: Path) -> None:
    path = model_copy / "model.safetensors"
    header, data = header_and_data(path)
    header["norm.weight"]["data_offsets"] = header["layers.0.ffn_norm.weight"]["data_offsets"]
    raw_safetensors(path, header, data)
    assert "overlap" in load_in_subprocess(model_copy)


def test_header_not_json(model_copy: Path) -> None:
    path = model_copy / "model.safetensors"
    header, data = header_and_data(path)
    blob = json.dumps(header).encode()[:-1] + b"]"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    assert "corrupt header" in load_in_subprocess(model_copy)


def rewrite_tensors(directory: Path, change) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda t: t.pop("layers.1.ffn.w2.weight"), "missing tensor layers.1.ffn.w2.weight"),
        (
            lambda t: t.update({"norm.weight": t["norm.weight"].astype(np.float16)}),
            "norm.weight has dtype F16, expected F32 or BF16",
        ),
        (
            lambda t: t.update({"layers.0.attn.wk.weight": np.zeros((64, 64), np.float32)}),
            "layers.0.attn.wk.weight has shape (64, 64), expected (32, 64)",
        ),
        (
            lambda t: t.update({"extra.weight": np.zeros(3, np.float32)}),
            "unexpected tensor extra.weight",
        ),
    ],
)
def test_wrong_tensors(model_copy: Path, change, expected: str) -> None:
    rewrite_tensors(model_copy, change)
    assert expected in load_in_subprocess(model_copy)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda c: c.pop("n_head"), "missing key 'n_head'"),
        (lambda c: c["moe"] if False else c.pop("rope_theta"), "missing key 'rope_theta'"),
        (lambda c: c.update(dim="64"), "key 'dim' must be an integer >= 1"),
        (lambda c: c.update(family="sparse"), "family 'sparse'"),
        (lambda c: c.update(n_kv_head=3), "n_kv_head must divide n_head"),
    ],
)
def test_bad_config(model_copy: Path, change, expected: str) -> None:
    config = json.loads((model_copy / "config.json").read_text())
    change(config)
    (model_copy / "config.json").write_text(json.dumps(config))
    msg = load_in_subprocess(model_copy)
    assert "config.json" in msg and expected in msg, msg


def test_config_not_json_and_missing_files(model_copy: Path, tmp_path: Path) -> None:
    (model_copy / "config.json").write_text("{ not json")
    assert "config.json: invalid JSON" in load_in_subprocess(model_copy)
    with pytest.raises(ValueError, match="no config.json"):
        ats_native.Model(str(tmp_path / "nowhere"))


def test_missing_moe_subconfig_key(saved_model, tmp_path: Path) -> None:
    _, directory = saved_model("tiny-moe")
    shutil.copytree(directory, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    del config["moe"]["top_k"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    assert "missing key 'moe.top_k'" in load_in_subprocess(tmp_path / "m")


def test_bad_arguments(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    model = ats_native.Model(str(directory), threads=1)
    with pytest.raises(ValueError, match=r"token id 512 at index 1 is out of range \[0, 512\)"):
        model.logits([3, 512])
    with pytest.raises(ValueError, match="out of range"):
        model.logits(np.array([[1, -1]]))
    with pytest.raises(ValueError, match="empty"):
        model.logits([])
    with pytest.raises(TypeError, match="integers"):
        model.logits([0.5, 1.0])
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model.logits(np.zeros(257, dtype=np.int64))
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model.generate([1, 2], 300)
    with pytest.raises(ValueError, match="out of range"):
        model.generate([1, 600], 3)
    with pytest.raises(ValueError, match="temperature"):
        model.generate([1], 3, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        model.generate_batch([[1]], 3, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="kernels 'sse9' is unknown"):
        ats_native.Model(str(directory), kernels="sse9")


def test_quantization_json_errors(saved_model, tmp_path: Path) -> None:
    from ats_infer.quantize import quantize_model_dir

    _, directory = saved_model("tiny-dense")
    out = quantize_model_dir(directory, tmp_path / "q4", bits=4, group_size=32)
    spec = json.loads((out / "quantization.json").read_text())
    spec["group_size"] = 48
    (out / "quantization.json").write_text(json.dumps(spec))
    assert "group_size must be 32, 64 or 128" in load_in_subprocess(out)
    spec["group_size"] = 64  # the files hold groups of 32: the scale shape no longer fits
    (out / "quantization.json").write_text(json.dumps(spec))
    assert ".scale has shape" in load_in_subprocess(out)


def test_random_inputs_are_fine(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    model = ats_native.Model(str(directory), threads=1)
    rng = random.Random(0)
    for _ in range(5):
        ids = [rng.randrange(512) for _ in range(rng.randint(1, 40))]
        assert np.isfinite(model.logits(ids)).all()
