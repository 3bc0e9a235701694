"""Checkpoint files: tree round trips, manifest verification, atomic publish, keep-last-N."""

import json
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from ats_train.checkpoint import (
    LATEST,
    MANIFEST,
    CheckpointError,
    checkpoints_dir,
    latest_checkpoint,
    load_tree,
    save_checkpoint,
    save_tree,
    verify_manifest,
)
from safetensors import SafetensorError


def _adamw_after_steps(seed: int, steps: int) -> tuple[torch.nn.Module, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
    groups = [
        {"params": [model[0].weight, model[2].weight], "weight_decay": 0.1},
        {
            "params": [model[0].bias, model[1].weight, model[1].bias, model[2].bias],
            "weight_decay": 0,
        },
    ]
    opt = torch.optim.AdamW(groups, lr=1e-2, betas=(0.8, 0.9))
    for _ in range(steps):
        model(torch.randn(4, 5)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_optimizer_state_round_trip_continues_bitwise(tmp_path: Path) -> None:
    model, opt = _adamw_after_steps(0, 3)
    save_tree(tmp_path, "optimizer", opt.state_dict())
    torch.save(model.state_dict(), tmp_path / "ref.pt")
    # a second optimizer that never stepped, loaded from the files, must continue identically
    model2, opt2 = _adamw_after_steps(0, 0)
    model2.load_state_dict(model.state_dict())
    opt2.load_state_dict(load_tree(tmp_path, "optimizer"))
    assert opt2.param_groups[0]["betas"] == (0.8, 0.9)
    for m, o in ((model, opt), (model2, opt2)):
        torch.manual_seed(1)
        m(torch.randn(4, 5)).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_rng_states_round_trip(tmp_path: Path) -> None:
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    tree = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "keys": {1: "int key", "s": None},
    }
    expected = (random.random(), np.random.rand(), torch.rand(1))
    save_tree(tmp_path, "rng", tree)
    loaded = load_tree(tmp_path, "rng")
    assert loaded["keys"] == {1: "int key", "s": None}
    random.setstate(loaded["python"])
    np.random.set_state(loaded["numpy"])
    torch.set_rng_state(loaded["torch"])
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(1), expected[2])


def test_unsupported_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="cannot checkpoint object"):
        save_tree(tmp_path, "bad", {"x": object()})


def _write(payload: str):
    def write(directory: Path) -> None:
        (directory / "model.bin").write_text(payload)
        (directory / "trainer_state").mkdir()
        (directory / "trainer_state" / "state.json").write_text(json.dumps({"p": payload}))

    return write


def test_manifest_lists_every_file_and_latest_is_published_last(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 12, _write("a"), keep_last=3)
    assert path.name == "step-000012"
    manifest = json.loads((path / MANIFEST).read_text())
    assert set(manifest["files"]) == {"model.bin", "trainer_state/state.json"}
    assert (checkpoints_dir(tmp_path) / LATEST).read_text().strip() == "step-000012"
    assert latest_checkpoint(tmp_path) == path


def test_corrupted_or_missing_file_is_detected(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 1, _write("a"), keep_last=3)
    (path / "model.bin").write_text("b")
    with pytest.raises(CheckpointError, match=r"model.bin has sha256 .* \(corrupted\)"):
        verify_manifest(path)
    (path / "model.bin").unlink()
    with pytest.raises(CheckpointError, match="model.bin listed in manifest.json is missing"):
        latest_checkpoint(tmp_path)
    (path / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        verify_manifest(path)


def test_crash_mid_write_leaves_previous_latest_loadable(tmp_path: Path) -> None:
    first = save_checkpoint(tmp_path, 10, _write("a"), keep_last=3)

    def crashing(directory: Path) -> None:
        (directory / "model.bin").write_text("half")
        raise KeyboardInterrupt  # the process dies while writing step 20

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 20, crashing, keep_last=3)
    root = checkpoints_dir(tmp_path)
    assert (root / "step-000020.tmp").is_dir()  # the torn write is still there ...
    assert latest_checkpoint(tmp_path) == first  # ... and ignored
    second = save_checkpoint(tmp_path, 20, _write("b"), keep_last=3)  # the next save cleans it
    assert not (root / "step-000020.tmp").exists()
    assert latest_checkpoint(tmp_path) == second


def test_complete_dir_not_named_by_latest_is_replaced(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 10, _write("a"), keep_last=3)
    save_checkpoint(tmp_path, 20, _write("old"), keep_last=3)
    # a crash between the rename and the `latest` update: latest still names step 10
    root = checkpoints_dir(tmp_path)
    (root / LATEST).write_text("step-000010\n")
    path = save_checkpoint(tmp_path, 20, _write("new"), keep_last=3)
    assert (path / "model.bin").read_text() == "new"
    assert latest_checkpoint(tmp_path) == path


def test_keep_last(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20, 25):
        save_checkpoint(tmp_path, step, _write(str(step)), keep_last=2)
    root = checkpoints_dir(tmp_path)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step-000020", "step-000025"]
    assert latest_checkpoint(tmp_path).name == "step-000025"


def test_latest_naming_a_missing_dir_is_an_error(tmp_path: Path) -> None:
    root = checkpoints_dir(tmp_path)
    root.mkdir(parents=True)
    (root / LATEST).write_text("step-000007\n")
    with pytest.raises(CheckpointError, match="names step-000007, which is missing"):
        latest_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path / "elsewhere") is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{}", "expected an object whose 'files' maps each file to its sha256"),
        (b"[]", "expected an object whose 'files' maps each file to its sha256"),
        (b'{"files": {"model.bin": 7}}', "expected an object whose 'files' maps"),
        (b"\xff\xfe{}", "manifest.json is not UTF-8 text"),
        (b'{"files": ', "manifest.json is not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "manifest.json is nested too deeply"),
        (b'{"files": {"../../x": "00"}}', "'../../x' is not a path inside the checkpoint"),
    ],
)
def test_a_malformed_manifest_is_a_checkpoint_error(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """A KeyError, TypeError, UnicodeDecodeError or RecursionError before."""
    path = save_checkpoint(tmp_path, 3, _write("a"), keep_last=3)
    (path / MANIFEST).write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        latest_checkpoint(tmp_path)


def test_latest_that_is_not_text_is_a_checkpoint_error(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 3, _write("a"), keep_last=3)
    (checkpoints_dir(tmp_path) / LATEST).write_bytes(b"\xffstep-000003\n")
    with pytest.raises(CheckpointError, match="latest is not UTF-8 text"):
        latest_checkpoint(tmp_path)


def test_a_malformed_tree_is_a_checkpoint_error(tmp_path: Path) -> None:
    save_tree(tmp_path, "state", {"step": 3, "w": torch.ones(2)})
    (tmp_path / "state.json").write_text('{"w": {"__tensor__": "elsewhere"}}')
    with pytest.raises(CheckpointError, match="state.json does not describe a checkpointed value"):
        load_tree(tmp_path, "state")
    (tmp_path / "state.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(CheckpointError, match="state.safetensors is not a readable safetensors"):
        load_tree(tmp_path, "state")


@pytest.fixture
def small_disk(tmp_path: Path):  # noqa: ANN201
    """A real 512 KiB filesystem (tmpfs; needs root, else the test skips)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("writer", ["safetensors", "json"])
def test_a_full_disk_during_a_checkpoint_is_one_error_and_latest_stays(
    small_disk: Path, writer: str
) -> None:
    """No space left while the step dir is written: a CheckpointError naming the step and the
    checkpoint `latest` still names (a SafetensorError traceback before); the torn .tmp dir is
    removed, so the space is free again and the next checkpoint fits."""
    first = save_checkpoint(small_disk, 2, _write("a"), keep_last=3)

    def too_large(directory: Path) -> None:
        (directory / "trainer_state").mkdir()
        if writer == "safetensors":
            save_tree(directory / "trainer_state", "optimizer", {"m": torch.zeros(1 << 18)})
        else:
            (directory / "trainer_state" / "state.json").write_text("x" * (1 << 20))

    with pytest.raises(CheckpointError) as e:
        save_checkpoint(small_disk, 4, too_large, keep_last=3)
    assert "could not write the checkpoint of step 4" in str(e.value)
    assert "No space left on device" in str(e.value)
    assert str(e.value).endswith("`latest` still names step-000002")
    cause = {"safetensors": SafetensorError, "json": OSError}[writer]
    assert type(e.value.__cause__) is cause
    assert not (checkpoints_dir(small_disk) / "step-000004.tmp").exists()
    assert latest_checkpoint(small_disk) == first
    assert save_checkpoint(small_disk, 4, _write("b"), keep_last=3).name == "step-000004"
