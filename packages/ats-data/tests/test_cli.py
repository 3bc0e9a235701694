"""The ats-data command: prepare + info, and one-line errors with a non-zero exit on bad input. The
cases call cli.main in this process (the same parser, messages and exit codes, without an
interpreter start per call); test_help runs the real `python -m ats_data.cli`."""

import contextlib
import io
import subprocess
import sys
from dataclasses import dataclass

import pytest
from ats_data.cli import main
from ats_data.dataset import ShardDataset
from ats_data.sources import open_source


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def ats_data(*args: object) -> Result:
    """What `ats-data ARGS` exits with and prints (argparse's SystemExit is the exit status)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:
            code = exit_.code
    return Result(code, out.getvalue(), err.getvalue())


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
    """The installed module as a process."""
    command = [sys.executable, "-m", "ats_data.cli", "prepare", "--help"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert "--val-fraction" in result.stdout and "--workers" in result.stdout


def assert_one_line_error(result: Result, pattern: str) -> None:
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


def test_bad_tokenizer_and_json_inputs_are_one_line(tokenizer_path, tmp_path):
    """Tracebacks before: a tokenizer.json the tokenizer refuses (TokenizerFileError), a JSONL
    record or index.json nested too deep (RecursionError); --workers 100000 started 100000
    processes; the JSONL position was cut off ("... starting at")."""
    bad_tok = tmp_path / "tok.json"
    bad_tok.write_text("[1, 2]", encoding="utf-8")
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "one"}\n{"text": "two"}\n', encoding="utf-8")
    prep = ["prepare", "--source", src, "--out", tmp_path / "o"]
    assert_one_line_error(ats_data(*prep, "--tokenizer", bad_tok), "not a tokenizer.json")
    result = ats_data(*prep, "--tokenizer", tokenizer_path, "--workers", "100000")
    assert_one_line_error(result, "workers must be in [1, ")
    src.write_text('{"text": "one"}\n{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    result = ats_data(*prep, "--tokenizer", tokenizer_path)
    assert_one_line_error(result, "d.jsonl: not valid JSON for this reader")
    src.write_text('{"text": "one"}\n{"text": "two}\n', encoding="utf-8")
    result = ats_data(*prep, "--tokenizer", tokenizer_path)
    assert_one_line_error(
        result, "d.jsonl: not valid JSON at line 2 column 10: Unterminated string"
    )
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "index.json").write_text("[" * 100_000, encoding="utf-8")
    assert_one_line_error(ats_data("info", folder), "index.json: not valid JSON for this reader")


def test_val_fraction_zero_is_the_documented_way_to_skip_validation(tokenizer_path, tmp_path):
    src = tmp_path / "one.txt"
    src.write_text("a single paragraph", encoding="utf-8")
    # one tokenizer process: a pool of spawned workers is prepared's own (the module fixture)
    prep = ["prepare", "--source", src, "--tokenizer", tokenizer_path, "--workers", "1"]
    result = ats_data(*prep, "--out", tmp_path / "a")
    assert_one_line_error(result, "or a larger val_fraction")
    assert "val_fraction=0" not in result.stderr
    assert "0: no val documents" in ats_data("prepare", "--help").stdout
    result = ats_data(*prep, "--out", tmp_path / "b", "--val-fraction", "0")
    assert result.returncode == 0, result.stderr
    assert "val        0 docs  0 tokens  0 shards" in result.stdout
