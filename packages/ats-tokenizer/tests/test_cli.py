"""CLI round trip through real subprocesses, --help, and one-line errors with a non-zero exit."""

import json
import subprocess
import sys

import pytest
from ats_tokenizer import Tokenizer
from ats_tokenizer_inputs import STDLIB

CLI = [sys.executable, "-m", "ats_tokenizer.cli"]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True)


def test_train_encode_decode_round_trip(tmp_path):
    files = [str(p) for p in sorted(STDLIB.glob("*.py"))[:3]]
    out = tmp_path / "tok.json"
    result = run("train", "--input", *files, "--vocab-size", "400", "--out", str(out))
    assert result.returncode == 0, result.stderr
    tok = Tokenizer.load(out)
    assert tok.vocab_size == 400 and f"sha256={tok.sha256()}" in result.stdout
    text = "def f(x):\n    return x + 1  # 🙂 <|endoftext|>"
    enc = run("encode", "--tokenizer", str(out), "--allow-special", stdin=text)
    ids = json.loads(enc.stdout)
    assert ids == tok.encode(text, allowed_special="all")
    dec = run("decode", "--tokenizer", str(out), "--ids", json.dumps(ids))
    assert dec.returncode == 0 and dec.stdout == text


@pytest.mark.parametrize("command", ["train", "encode", "decode"])
def test_help(command):
    result = run(command, "--help")
    assert result.returncode == 0 and "usage: ats-tokenizer" in result.stdout


def _one_line_error(result: subprocess.CompletedProcess, needle: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_bad_input_errors(tmp_path):
    missing = str(tmp_path / "missing.json")
    _one_line_error(run("encode", "--tokenizer", missing, "--text", "x"), "does not exist")
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{", encoding="utf-8")
    _one_line_error(run("decode", "--tokenizer", str(corrupt), "--ids", "[1]"), "not valid JSON")
    txt = tmp_path / "t.txt"
    txt.write_text("hello world", encoding="utf-8")
    out = str(tmp_path / "o.json")
    result = run("train", "--input", str(txt), "--vocab-size", "100", "--out", out)
    _one_line_error(result, "vocab_size=100 is too small")
    result = run("train", "--input", str(txt), "--vocab-size", "300", "--out", out)
    assert result.returncode == 0
    _one_line_error(run("decode", "--tokenizer", out, "--ids", "[5, 300]"), "out of range")
    _one_line_error(run("decode", "--tokenizer", out, "--ids", "[1, 'a']"), "not valid JSON")
    _one_line_error(run("encode", "--tokenizer", out, "--text", "<|endoftext|>"), "disallowed")
