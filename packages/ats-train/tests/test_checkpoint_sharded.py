"""Sharded checkpoints in one process (checkpoint.format = "sharded"): bitwise-exact resume
whichever format wrote the checkpoint and whichever the run now writes, keep-last-N on sharded
dirs, a corrupted shard refused before anything is written, no code run by a pickle planted in a
checkpoint, and the resume rule for DeepSpeed's shards. Several ranks: tests/distributed (fsdp2,
ddp, deepspeed); resharding chunks in one process: test_optimizer_shards.py."""

import hashlib
import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ats_train.backends import SingleBackend
from ats_train.checkpoint import LATEST, CheckpointError, checkpoints_dir, write_manifest
from ats_train.checkpoint_sharded import LAYOUT, SHARDS_DIR, TRAINER_STATE, check_resumable
from ats_train.cli import main
from ats_train.precision import build_precision

FORMATS = ("full", "sharded")


def _args(overrides, run_dir: Path, checkpoint_format: str) -> list[str]:  # noqa: ANN001
    extra = {"train__sample_tokens": 0, "checkpoint__format": checkpoint_format}
    return ["--run-dir", str(run_dir), *overrides(**extra)]


def _roll_back_to_step_4(src: Path, dst: Path) -> None:
    """A copy of a finished 6-step run as if it had died right after its step-4 checkpoint."""
    shutil.copytree(src, dst)
    shutil.rmtree(dst / "model")
    shutil.rmtree(checkpoints_dir(dst) / "step-000006")
    (checkpoints_dir(dst) / LATEST).write_text("step-000004\n")


@pytest.fixture(scope="module")
def runs(overrides, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: ANN001
    """format -> an uninterrupted 6-step run (checkpoints at 2, 4, 6; keep_last 2)."""
    out = {}
    for checkpoint_format in FORMATS:
        run_dir = tmp_path_factory.mktemp(checkpoint_format)
        assert main(_args(overrides, run_dir, checkpoint_format)) == 0
        out[checkpoint_format] = run_dir
    return out


def test_sharded_checkpoints_hold_safetensors_shards_and_are_pruned(
    runs: dict[str, Path],
    assert_same_run,  # noqa: ANN001
) -> None:
    """The format changes what is written, not what is trained (bitwise); keep_last prunes."""
    assert_same_run(runs["sharded"], runs["full"])
    root = checkpoints_dir(runs["sharded"])
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step-000004", "step-000006"]
    for step_dir in root.glob("step-*"):
        state_dir = step_dir / TRAINER_STATE
        assert not (state_dir / "optimizer.json").exists()  # nothing gathered
        layout = json.loads((state_dir / LAYOUT).read_text())
        assert layout == {
            "format_version": 2,
            "writer": "safetensors",
            "backend": "single",
            "world_size": 1,
        }
        files = json.loads((step_dir / "manifest.json").read_text())["files"]
        shards = {
            f"{TRAINER_STATE}/{SHARDS_DIR}/{name}"
            for name in ("rank-00000.safetensors", "rank-00000.json", "param_groups.json")
        }
        assert shards == {f for f in files if f.startswith(f"{TRAINER_STATE}/{SHARDS_DIR}/")}
        assert f"{TRAINER_STATE}/rng/rank-00000.json" in files


@pytest.mark.parametrize(
    ("saved", "resumed"), [("sharded", "sharded"), ("full", "sharded"), ("sharded", "full")]
)
def test_resume_is_bitwise_exact_whichever_format_wrote_the_checkpoint(
    runs: dict[str, Path],
    overrides,  # noqa: ANN001
    tmp_path: Path,
    saved: str,
    resumed: str,
    assert_same_run,  # noqa: ANN001
) -> None:
    """Resume reads the format the checkpoint holds; checkpoint.format only decides the next."""
    run_dir = tmp_path / "resumed"
    _roll_back_to_step_4(runs[saved], run_dir)
    assert main(_args(overrides, run_dir, resumed)) == 0
    assert_same_run(run_dir, runs["full"])
    final_state = checkpoints_dir(run_dir) / "step-000006" / TRAINER_STATE
    assert (final_state / LAYOUT).is_file() == (resumed == "sharded")


def _snapshot(run_dir: Path) -> dict[str, str]:
    return {
        p.relative_to(run_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def test_truncated_shard_is_refused_and_nothing_is_overwritten(
    runs: dict[str, Path],
    overrides,  # noqa: ANN001
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_dir = tmp_path / "resumed"
    _roll_back_to_step_4(runs["sharded"], run_dir)
    shard = checkpoints_dir(run_dir) / "step-000004" / TRAINER_STATE / SHARDS_DIR
    shard = shard / "rank-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    before = _snapshot(run_dir)
    assert main(_args(overrides, run_dir, "sharded")) != 0
    err = capsys.readouterr().err
    assert f"{TRAINER_STATE}/{SHARDS_DIR}/rank-00000.safetensors has sha256" in err
    assert "(corrupted)" in err
    assert _snapshot(run_dir) == before


def test_deepspeed_shards_do_not_resume_under_another_backend(tmp_path: Path) -> None:
    """DeepSpeed's ZeRO files hold this world size's partitions: only deepspeed at the saved world
    size and stage reads them (the same-backend case runs in distributed/test_deepspeed.py).
    safetensors shards reshard: any of their readers at any world size."""
    state_dir = tmp_path / TRAINER_STATE
    state_dir.mkdir()
    backend = SingleBackend(torch.device("cpu"), build_precision("fp32", torch.device("cpu")))
    layout = {"format_version": 2, "writer": "safetensors", "backend": "fsdp2", "world_size": 2}
    (state_dir / LAYOUT).write_text(json.dumps(layout))
    check_resumable(tmp_path, backend)
    layout = {"format_version": 2, "writer": "deepspeed", "backend": "deepspeed", "world_size": 2}
    (state_dir / LAYOUT).write_text(json.dumps({**layout, "zero_stage": 2}))
    with pytest.raises(CheckpointError) as e:
        check_resumable(tmp_path, backend)
    assert "written by deepspeed on 2 rank(s), ZeRO stage 2" in str(e.value)
    assert "this run is single on 1 rank(s)" in str(e.value)


class _Payload:
    """Unpickling this creates `marker`: the code a planted pickle would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


def _payload(marker: Path) -> bytes:
    return pickle.dumps({"state_dict_metadata": _Payload(marker)})


def test_the_payload_runs_code_when_unpickled(tmp_path: Path) -> None:
    """The control for the two tests below: their payload is live."""
    pickle.loads(_payload(tmp_path / "control"))
    assert (tmp_path / "control").exists()


def _planted(runs: dict[str, Path], run_dir: Path, plant: Callable[[Path], None]) -> Path:
    """The sharded run rolled back to step 4, `plant(trainer_state)` applied and the manifest
    rewritten to match: what whoever wrote the checkpoint can do."""
    _roll_back_to_step_4(runs["sharded"], run_dir)
    step_dir = checkpoints_dir(run_dir) / "step-000004"
    plant(step_dir / TRAINER_STATE)
    write_manifest(step_dir, 4)
    return step_dir


def test_torch_distributed_checkpoint_shards_are_refused_unread(
    runs: dict[str, Path],
    overrides,  # noqa: ANN001
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A checkpoint in the torch.distributed.checkpoint layout (format_version 1), whose reader
    would pickle.load its .metadata, stops the resume before any file of it is opened."""
    marker = tmp_path / "marker"

    def plant(state_dir: Path) -> None:
        shutil.rmtree(state_dir / SHARDS_DIR)
        (state_dir / "optimizer_dcp").mkdir()
        (state_dir / "optimizer_dcp" / ".metadata").write_bytes(_payload(marker))
        (state_dir / "optimizer_dcp" / "__0_0.distcp").write_bytes(_payload(marker))
        layout = {"format_version": 1, "writer": "dcp", "backend": "single", "world_size": 1}
        (state_dir / LAYOUT).write_text(json.dumps(layout))

    run_dir = tmp_path / "resumed"
    _planted(runs, run_dir, plant)
    before = _snapshot(run_dir)
    assert main(_args(overrides, run_dir, "sharded")) == 2
    err = capsys.readouterr().err
    assert f"{TRAINER_STATE}/{LAYOUT}: format_version 1" in err
    assert "unpickles on load" in err
    assert len(err.strip().splitlines()) == 1
    assert not marker.exists()
    assert _snapshot(run_dir) == before


@pytest.mark.parametrize("target", ["rank-00000.safetensors", "param_groups.json"])
def test_a_pickle_in_place_of_a_shard_file_is_refused_and_runs_nothing(
    runs: dict[str, Path],
    overrides,  # noqa: ANN001
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
) -> None:
    marker = tmp_path / "marker"

    def plant(state_dir: Path) -> None:
        (state_dir / SHARDS_DIR / target).write_bytes(_payload(marker))

    run_dir = tmp_path / "resumed"
    _planted(runs, run_dir, plant)
    before = _snapshot(run_dir)
    assert main(_args(overrides, run_dir, "sharded")) == 2
    err = capsys.readouterr().err
    assert f"{SHARDS_DIR}/{target}" in err
    assert len(err.strip().splitlines()) == 1
    assert not marker.exists()
    assert _snapshot(run_dir) == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{}", "manifest.json: expected an object whose 'files' maps each file to its sha256"),
        (b"[]", "manifest.json: expected an object whose 'files' maps each file to its sha256"),
        (b"\xff{}", "manifest.json is not UTF-8 text"),
    ],
)
def test_a_malformed_manifest_stops_the_resume_in_one_line(
    runs: dict[str, Path],
    overrides,  # noqa: ANN001
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    message: str,
) -> None:
    """KeyError, TypeError and UnicodeDecodeError tracebacks before."""
    run_dir = tmp_path / "resumed"
    _roll_back_to_step_4(runs["full"], run_dir)
    (checkpoints_dir(run_dir) / "step-000004" / "manifest.json").write_bytes(content)
    before = _snapshot(run_dir)
    assert main(_args(overrides, run_dir, "full")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert _snapshot(run_dir) == before
