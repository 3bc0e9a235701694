"""`ats-train` end to end in-process: run dir contents, plots, and one-line errors on bad input."""

import hashlib
from pathlib import Path

import pytest
from ats_train.cli import main
from ats_train.metrics import read_metrics
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def finished_run(overrides, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    assert main(["--run-dir", str(run_dir), *overrides()]) == 0
    return run_dir


def test_run_dir_holds_config_metrics_tensorboard_checkpoints_model(finished_run: Path) -> None:
    config = (finished_run / "config.toml").read_text()
    assert 'preset = "tiny-hybrid"' in config and "steps = 6" in config
    records = read_metrics(finished_run)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records if r["kind"] == "val"] == [3, 6]
    for r in train:
        for key in ("loss", "lr", "grad_norm", "tokens_per_s", "aux/moe_lb", "aux/moe_z"):
            assert isinstance(r[key], float), key
        assert r["mfu"] is None  # CPU: no trustworthy peak
        fractions = r["moe/expert_fraction"]  # (n_moe_layers, E)
        assert len(fractions) == 2 and all(sum(row) == pytest.approx(1.0) for row in fractions)
        assert len(r["moe/entropy"]) == 2 and len(r["moe/dropped_fraction"]) == 2
        assert len(r["mod/selected_fraction"]) == 1
    (events_dir,) = {p.parent for p in (finished_run / "tb").rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert "train/moe/expert_fraction/layer1/expert7" in acc.Tags()["scalars"]
    assert [e.step for e in acc.Scalars("val/loss")] == [3, 6]
    checkpoints = finished_run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-000004", "step-000006"]
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (finished_run / "model" / name).is_file()


def test_plot_writes_pngs(finished_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["plot", str(finished_run)]) == 0
    out = capsys.readouterr().out
    for name in ("loss.png", "expert_utilization.png"):
        path = finished_run / "plots" / name
        assert path.read_bytes()[:8] == PNG_MAGIC
        assert f"wrote {path}" in out


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, *needles: str) -> None:
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def test_config_typo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--run-dir", str(tmp_path / "r"), "train.setps=3"])
    _one_line_error(capsys, code, "train.setps", "did you mean 'train.steps'")


def test_missing_data_path(overrides, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "no" / "such.txt"
    code = main(["--run-dir", str(tmp_path / "r"), *overrides(data__source=missing)])
    _one_line_error(capsys, code, "source not found", str(missing))


def test_unwritable_run_dir(overrides, tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    code = main(["--run-dir", str(blocker / "run"), *overrides()])
    _one_line_error(capsys, code, "is not writable", str(blocker / "run"))


def test_truncated_shard(prepared, overrides, tmp_path: Path, capsys) -> None:
    shards = tmp_path / "shards"
    shards_src, _ = prepared
    shards.mkdir()
    for f in shards_src.iterdir():
        (shards / f.name).write_bytes(f.read_bytes())
    shard = next(p for p in sorted(shards.iterdir()) if p.suffix == ".bin")
    shard.write_bytes(shard.read_bytes()[:-6])
    code = main(["--run-dir", str(tmp_path / "r"), *overrides(data__source=shards)])
    _one_line_error(capsys, code, str(shard), "truncated")


@pytest.mark.parametrize(
    ("text", "needle"),
    [("not json", "not valid JSON"), ('{"model": {"type": "BPE"}}', "field ")],
    ids=["not-json", "not-a-bpe-tokenizer"],
)
def test_malformed_tokenizer_file(
    overrides, tmp_path: Path, capsys, text: str, needle: str
) -> None:
    """A user's file, so one line and exit 2; an internal ValueError would keep its traceback."""
    bad = tmp_path / "tokenizer.json"
    bad.write_text(text)
    code = main(["--run-dir", str(tmp_path / "r"), *overrides(data__tokenizer=bad)])
    _one_line_error(capsys, code, str(bad), needle)


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_checkpoint_of_another_model_shape(finished_run: Path, overrides, capsys) -> None:
    capsys.readouterr()
    before = _tree_digest(finished_run)
    code = main(["--run-dir", str(finished_run), *overrides(model__n_layer=3)])
    _one_line_error(capsys, code, "another model shape", "n_layer: checkpoint 2, this run 3")
    assert _tree_digest(finished_run) == before  # nothing already written was touched


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_raw_source_is_prepared_on_the_fly_and_cached(
    fmt: str, overrides, tmp_path: Path, capsys
) -> None:
    """A raw JSONL / Parquet source: tokenizer trained on it, shards prepared into data.cache_dir
    keyed by source and tokenizer, and reused by a second run."""
    import json
    import sysconfig

    import pyarrow as pa
    import pyarrow.parquet as pq

    text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    docs = [d for d in text.split("\n\n") if d.strip()]
    source = tmp_path / f"docs.{fmt}"
    if fmt == "jsonl":
        source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    else:
        pq.write_table(pa.table({"text": docs}), source)
    cache = tmp_path / "cache"
    args = overrides(
        data__source=source,
        data__tokenizer="none",
        data__vocab_size=300,
        data__val_fraction=0.2,
        data__cache_dir=cache,
        train__steps=2,
        checkpoint__every=0,
    )
    for run in ("a", "b"):
        assert main(["--run-dir", str(tmp_path / run), *args]) == 0
    assert len(list((cache / "tokenizers").iterdir())) == 1
    assert len(list((cache / "shards").iterdir())) == 1
    # rich wraps long lines, even inside a long path: compare with all whitespace removed
    out = "".join(capsys.readouterr().out.split())
    assert "".join(f"data: {source}: 1 files".split()) in out
