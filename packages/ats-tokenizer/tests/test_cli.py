"""CLI round trip, --help, and one-line errors with a non-zero exit. The cases call cli.main in
this process (the same parser, messages and exit codes, without an interpreter start per call);
test_help runs the real `python -m ats_tokenizer.cli`."""

import contextlib
import io
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from ats_tokenizer import Tokenizer
from ats_tokenizer.cli import main
from ats_tokenizer_inputs import STDLIB

CLI = [sys.executable, "-m", "ats_tokenizer.cli"]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run(*args: str, stdin: str | bytes = b"") -> Result:
    """What `ats-tokenizer ARGS` exits with and prints, `stdin` its standard input; the root
    logger starts without handlers, as in a new process, so main's logging.basicConfig writes to
    the captured stderr."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level, stdin_before = root.handlers[:], root.level, sys.stdin
    root.handlers.clear()
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:
                code = exit_.code
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        sys.stdin = stdin_before
    return Result(code, out.getvalue(), err.getvalue())


def test_train_encode_decode_round_trip(tmp_path):
    files = [str(p) for p in sorted(STDLIB.glob("*.py"))[:3]]
    out = tmp_path / "tok.json"
    result = run("train", "--input", *files, "--vocab-size", "400", "--out", str(out))
    assert result.returncode == 0, result.stderr
    tok = Tokenizer.load(out)
    assert tok.vocab_size == 400 and f"sha256={tok.sha256()}" in result.stdout
    text = "def f(x):\n    return x + 1  # 🙂 <|endoftext|>"
    enc = run("encode", "--tokenizer", str(out), "--allowed-special", "all", stdin=text)
    ids = json.loads(enc.stdout)
    assert ids == tok.encode(text, allowed_special="all")
    dec = run("decode", "--tokenizer", str(out), "--ids", json.dumps(ids))
    assert dec.returncode == 0 and dec.stdout == text


@pytest.mark.parametrize("command", ["train", "encode", "decode"])
def test_help(command):
    """The installed module as a process."""
    result = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "usage: ats-tokenizer" in result.stdout


def _one_line_error(result: Result, needle: str) -> None:
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


def _trained(tmp_path) -> str:
    txt = tmp_path / "t.txt"
    txt.write_text("hello world, hello there\n" * 20, encoding="utf-8")
    out = str(tmp_path / "tok.json")
    assert run("train", "--input", str(txt), "--vocab-size", "300", "--out", out).returncode == 0
    return out


def test_special_token_flags_follow_tiktoken(tmp_path):
    """--allowed-special / --disallowed-special give the CLI what encode()'s arguments give Python;
    the refusal names the flags (it named Python arguments before)."""
    path = _trained(tmp_path)
    tok = Tokenizer.load(path)
    text = "a<|endoftext|>b"

    def encode(*flags: str) -> list[int]:
        result = run("encode", "--tokenizer", path, "--text", text, *flags)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    as_id = tok.encode(text, allowed_special="all")
    as_text = tok.encode(text, disallowed_special=())
    assert as_id != as_text and as_text == tok.encode_ordinary(text)
    assert encode("--allowed-special", "all") == as_id
    assert encode("--allowed-special", "<|endoftext|>") == as_id
    assert encode("--disallowed-special", "none") == as_text
    refused = run("encode", "--tokenizer", path, "--text", text)
    _one_line_error(refused, "--allowed-special '<|endoftext|>' (or all)")
    assert "--disallowed-special none to encode it as plain text" in refused.stderr
    assert "allowed_special=" not in refused.stderr
    unknown = run("encode", "--tokenizer", path, "--text", "x", "--allowed-special", "<|x|>,all")
    _one_line_error(unknown, "--allowed-special names ['<|x|>', 'all']")


def test_text_that_is_not_utf8_is_named_as_bytes(tmp_path):
    path = _trained(tmp_path)
    result = run("encode", "--tokenizer", path, stdin=b"ok \xff")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "ats-tokenizer encode: error: stdin: not UTF-8 text (byte 0xff at offset 3)"
    )


def test_deeply_nested_json_is_one_line(tmp_path):
    path = _trained(tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    _one_line_error(run("decode", "--tokenizer", path, stdin=deep), "stdin: not valid JSON for")
    deep_file = tmp_path / "deep.json"
    deep_file.write_text(deep, encoding="utf-8")
    result = run("encode", "--tokenizer", str(deep_file), "--text", "x")
    _one_line_error(result, "deep.json: not valid JSON for this reader")
    _one_line_error(run("decode", "--tokenizer", path, "--ids", "[1, 2"), "line 1 column 6")


def test_train_never_writes_over_an_input_or_an_existing_file(tmp_path):
    txt = tmp_path / "t.txt"
    original = "hello world, hello there\n" * 20
    txt.write_text(original, encoding="utf-8")
    args = ["train", "--input", str(txt), "--vocab-size", "300"]
    _one_line_error(run(*args, "--out", str(txt), "--force"), "is also an --input")
    assert txt.read_text(encoding="utf-8") == original
    out = tmp_path / "tok.json"
    out.write_text("mine", encoding="utf-8")
    _one_line_error(run(*args, "--out", str(out)), "already exists: pass --force")
    assert out.read_text(encoding="utf-8") == "mine"
    assert run(*args, "--out", str(out), "--force").returncode == 0
    assert Tokenizer.load(out).vocab_size > 256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt", "tok.json"]  # no temp file left
    _one_line_error(run(*args, "--out", str(tmp_path)), "is a folder")
    _one_line_error(run(*args, "--out", str(tmp_path / "no" / "x.json")), "does not exist")


def test_inputs_that_are_not_regular_files(tmp_path):
    out = str(tmp_path / "o.json")
    result = run("train", "--input", str(tmp_path), "--vocab-size", "300", "--out", out)
    _one_line_error(result, "is a folder, expected a file")
    if Path("/dev/zero").exists():  # read forever before
        result = run("train", "--input", "/dev/zero", "--vocab-size", "300", "--out", out)
        _one_line_error(result, "'/dev/zero' is not a regular file")
        result = run("encode", "--tokenizer", "/dev/zero", "--text", "x")
        _one_line_error(result, "'/dev/zero' is not a regular file")
