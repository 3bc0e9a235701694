"""output_paths.py through quantize and export-gguf: an existing output is replaced only with
force, an input never (same path, symlink, hard link, a directory holding it), and a failure or
Ctrl-C leaves the previous output and no temporary file."""

import os
import shutil
import stat
from pathlib import Path

import pytest
from ats_infer import quantize as quantize_module
from ats_infer.gguf_export import export_gguf
from ats_infer.quantize import quantize_model_dir


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def model(dense_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(dense_dir, tmp_path / "model"))


def test_quantize_refuses_another_models_directory_unless_forced(model, dense_dir, tmp_path):
    other = Path(shutil.copytree(dense_dir, tmp_path / "other"))
    before = snapshot(other)
    with pytest.raises(FileExistsError, match="exists and is not empty; .* --force"):
        quantize_model_dir(model, other, 8)
    assert snapshot(other) == before
    quantize_model_dir(model, other, 8, force=True)
    assert "quantization.json" in snapshot(other)
    assert sorted(os.listdir(tmp_path)) == ["model", "other"]  # no temporary left beside it


def test_quantize_writes_into_an_empty_directory(model, tmp_path):
    (tmp_path / "empty").mkdir()
    quantize_model_dir(model, tmp_path / "empty", 8)
    assert (tmp_path / "empty" / "quantization.json").is_file()


def test_export_never_writes_over_its_own_source(model, tmp_path):
    before = snapshot(model)
    source = model / "model.safetensors"
    os.link(source, tmp_path / "hard-link")
    os.symlink(source, tmp_path / "soft-link")
    for out in (source, model / "config.json", tmp_path / "hard-link", tmp_path / "soft-link"):
        for force in (False, True):
            with pytest.raises(ValueError, match="is the input"):
                export_gguf(model, out, force=force)
    assert snapshot(model) == before
    export_gguf(model, model / "model.gguf")  # a new file inside the input directory is fine
    assert snapshot(model).keys() == {*before, "model.gguf"}


def test_quantize_never_replaces_its_source_or_a_directory_holding_it(model, tmp_path):
    before = snapshot(model)
    os.symlink(model, tmp_path / "link")
    for out in (model, tmp_path / "link", tmp_path):
        with pytest.raises(ValueError, match="is the input|holds the input"):
            quantize_model_dir(model, out, 8, force=True)
    assert snapshot(model) == before


def test_export_replaces_a_file_only_with_force(model, tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError, match="pass --force"):
        export_gguf(model, out)
    assert out.read_bytes() == b"someone else's"
    export_gguf(model, out, force=True)
    assert out.read_bytes()[:4] == b"GGUF"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask  # as a plain open() makes it
    empty = tmp_path / "empty.gguf"
    empty.touch()
    export_gguf(model, empty)  # an empty file is no one's data
    assert empty.read_bytes()[:4] == b"GGUF"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.mkdir(), "is a directory; expected a file"),
        (lambda p: os.symlink("/dev/null", p), "is a character device"),
        (lambda p: os.symlink(p.name, p), "is a symlink loop"),
    ],
)
def test_export_refuses_outputs_that_are_not_files(model, tmp_path, make, message):
    out = tmp_path / "out"
    make(out)
    with pytest.raises(ValueError, match=message):
        export_gguf(model, out, force=True)


def test_quantize_refuses_a_file_as_its_output_directory(model, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; expected a directory"):
        quantize_model_dir(model, tmp_path / "file", 8, force=True)
    assert (tmp_path / "file").read_text() == "x"


def test_a_failed_export_leaves_the_previous_output(make_model_dir, tmp_path):
    odd = make_model_dir("tiny-dense", dim=48, n_head=4, n_kv_head=2, ffn_dim=96)
    out = tmp_path / "m.gguf"
    out.write_bytes(b"previous")
    with pytest.raises(ValueError, match="not a multiple of the Q8_0 block"):
        export_gguf(odd, out, "q8_0", force=True)  # fails after the writer has begun
    assert out.read_bytes() == b"previous" and os.listdir(tmp_path) == ["m.gguf"]


def test_ctrl_c_during_quantize_leaves_the_previous_output(model, dense_dir, tmp_path, monkeypatch):
    previous = Path(shutil.copytree(dense_dir, tmp_path / "previous"))
    before = snapshot(previous)

    def interrupted(tensors, path, metadata):
        Path(path).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(quantize_module, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        quantize_model_dir(model, previous, 8, force=True)
    assert snapshot(previous) == before
    assert sorted(os.listdir(tmp_path)) == ["model", "previous"]
