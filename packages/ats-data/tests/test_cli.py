"""The ats-data command in real subprocesses: prepare + info, and one-line errors with a
non-zero exit on bad input."""

import subprocess
import sys

import pytest
from ats_data.dataset import ShardDataset
from ats_data.sources import open_source


def ats_data(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ats_data.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def prepared(tokenizer_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    src = root / "corpus.txt"
    src.write_text("\n\n".join(open_source("stdlib:email")), encoding="utf-8")
    out = root / "data"
    result = ats_data(
        "prepare",
        "--source",
        src,
        "--tokenizer",
        tokenizer_path,
        "--out",
        out,
        "--val-fraction",
        "0.1",
        "--workers",
        "2",
    )
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_prepare_then_info(prepared):
    out, prepare_stdout = prepared
    ds = ShardDataset(out)
    info = ats_data("info", out)
    assert info.returncode == 0, info.stderr
    for split in ("train", "val"):
        line = f"{ds.num_docs(split)} docs  {ds.num_tokens(split)} tokens"
        assert line in info.stdout and line in prepare_stdout
    assert ds.tokenizer_sha256 in info.stdout
    assert "verified   sha256 of every shard" in info.stdout


def test_help():
    result = ats_data("prepare", "--help")
    assert result.returncode == 0
    assert "--val-fraction" in result.stdout and "--workers" in result.stdout


def assert_one_line_error(result: subprocess.CompletedProcess, pattern: str) -> None:
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ats-data: error: ") and pattern in lines[0], lines[0]


def test_bad_inputs_exit_non_zero_with_one_line(prepared, tokenizer_path, tmp_path):
    out, _ = prepared
    assert_one_line_error(
        ats_data(
            "prepare",
            "--source",
            tmp_path / "nope.txt",
            "--tokenizer",
            tokenizer_path,
            "--out",
            tmp_path / "o",
        ),
        "source not found",
    )
    (tmp_path / "x.zip").write_bytes(b"PK")
    assert_one_line_error(
        ats_data(
            "prepare",
            "--source",
            tmp_path / "x.zip",
            "--tokenizer",
            tokenizer_path,
            "--out",
            tmp_path / "o",
        ),
        "unknown source format '.zip'",
    )
    assert_one_line_error(ats_data("info", tmp_path / "missing"), "dataset folder not found")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in out.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    shard = broken / "train-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    assert_one_line_error(ats_data("info", broken), "train-00000.bin")


def test_usage_error_exits_2():
    result = ats_data("prepare", "--source", "x")
    assert result.returncode == 2
    assert "required" in result.stderr
