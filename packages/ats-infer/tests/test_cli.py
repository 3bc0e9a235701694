"""cli.py as a user runs it: the commands, --help, and one-line errors. The cases call cli.main in
this process (the same parser, handlers and exit codes, without an interpreter start per call);
test_entry_point runs the real `python -m ats_infer.cli` for the exit statuses it returns."""

import json
import os
import shutil
import subprocess
import sys

import pytest


def assert_one_line_error(result, message: str) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("ats-infer: error:") and message in lines[-1], result.stderr
    assert "Traceback" not in result.stderr


def test_entry_point(tmp_path) -> None:
    """The installed module as a process: --help exits 0, a bad directory 1 with one line, a bad
    choice 2 (argparse)."""

    def ats_infer_process(*args: object) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "ats_infer.cli", *map(str, args)]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    result = ats_infer_process("quantize", "--help")
    assert result.returncode == 0 and "usage: ats-infer quantize" in result.stdout
    assert_one_line_error(
        ats_infer_process("quantize", tmp_path / "nowhere", "--bits", "8", "--out", tmp_path / "q"),
        "not a model directory",
    )
    usage = ats_infer_process("quantize", tmp_path, "--bits", "3", "--out", tmp_path / "q")
    assert usage.returncode == 2 and "invalid choice: 3" in usage.stderr


@pytest.mark.parametrize("command", ["generate", "quantize", "export-gguf", "eval-ppl"])
def test_help(command: str, ats_infer) -> None:
    result = ats_infer(command, "--help")
    assert result.returncode == 0 and "usage: ats-infer " + command in result.stdout


def test_quantize_and_export(dense_dir, tmp_path, ats_infer) -> None:
    result = ats_infer(
        "quantize", dense_dir, "--bits", "4", "--group-size", "32", "--out", tmp_path / "q4"
    )
    assert result.returncode == 0, result.stderr
    spec = json.loads((tmp_path / "q4" / "quantization.json").read_text())
    assert (spec["bits"], spec["group_size"]) == (4, 32)
    result = ats_infer("export-gguf", dense_dir, "--out", tmp_path / "m.gguf", "--outtype", "q8_0")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m.gguf").read_bytes()[:4] == b"GGUF"


def test_bad_input_exits_with_one_line(dense_dir, tmp_path, ats_infer) -> None:
    assert_one_line_error(
        ats_infer("quantize", dense_dir, "--bits", "4", "--out", tmp_path / "q"), "--group-size"
    )
    assert_one_line_error(
        ats_infer(
            "quantize", dense_dir, "--bits", "4", "--group-size", "128", "--out", tmp_path / "q"
        ),
        "not divisible by group_size 128",
    )
    assert_one_line_error(
        ats_infer("quantize", tmp_path / "nowhere", "--bits", "8", "--out", tmp_path / "q"),
        "not a model directory",
    )
    assert_one_line_error(
        ats_infer("export-gguf", tmp_path / "nowhere", "--out", tmp_path / "m.gguf"),
        "not a model directory",
    )
    assert_one_line_error(
        ats_infer("generate", tmp_path / "nowhere", "--prompt", "x"), "not a model directory"
    )
    assert_one_line_error(
        ats_infer("generate", dense_dir, "--prompt", "x", "--engine", "torch", "--kv-cache", "f16"),
        "--kv-cache f16 is the native engine's",
    )
    # the option reaches the native runtime (which refuses an f16 cache on the GPU)
    assert_one_line_error(
        ats_infer("generate", dense_dir, "--prompt", "x", "--engine", "native", "--kv-cache", "f16",
                  "--device", "cuda"),
        "kv_cache 'f16' is for the CPU",
    )  # fmt: skip
    usage = ats_infer("quantize", dense_dir, "--bits", "3", "--out", tmp_path / "q")
    assert usage.returncode == 2 and "invalid choice: 3" in usage.stderr
    usage = ats_infer("generate", dense_dir, "--prompt", "x", "--kv-cache", "bf16")
    assert usage.returncode == 2 and "invalid choice: 'bf16'" in usage.stderr


@pytest.mark.parametrize("engine", ["torch", "native", "native-f16"])
def test_generate_is_greedy_and_engines_agree(trained_dense_dir, engine, ats_infer) -> None:
    """The native engine, with either KV cache (f16: keys and values rounded to half precision,
    which leaves this trained model's greedy choices as they are), continues as torch does."""
    options = ["--engine", engine]
    if engine.startswith("native"):
        pytest.importorskip("ats_native")
        options = ["--engine", "native", "--kv-cache", "f16" if engine == "native-f16" else "f32"]
    args = ["generate", trained_dense_dir, "--prompt", "def f(x):\n", "--temperature", "0"]
    result = ats_infer(*args, "--max-new-tokens", "16", *options, "--threads", "1")
    assert result.returncode == 0, result.stderr
    again = ats_infer(*args, "--max-new-tokens", "16", "--engine", "torch")
    assert result.stdout == again.stdout and result.stdout.strip()


def copy_with_config(model_dir, tmp_path, **changes):
    directory = tmp_path / "model"
    shutil.copytree(model_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_bad_model_directories_exit_with_one_line(dense_dir, tmp_path, ats_infer) -> None:
    """Issue 22's reproducers: no traceback, rc 1, the file, field and value named."""
    bad = copy_with_config(dense_dir, tmp_path, n_head=0)
    assert_one_line_error(
        ats_infer("export-gguf", bad, "--out", tmp_path / "m.gguf"), "n_head = 0 is invalid"
    )
    bad = copy_with_config(dense_dir, tmp_path / "b", n_layer=3)
    assert_one_line_error(
        ats_infer("generate", bad, "--prompt", "x", "--engine", "torch"),
        "n_layer = 3 does not match the tensors",
    )
    path = bad / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["norm.weight"]["data_offsets"] = ["0", "256"]
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n :])
    assert_one_line_error(
        ats_infer("quantize", bad, "--bits", "8", "--out", tmp_path / "q"),
        "data_offsets ['0', '256'] is not [begin, end] of non-negative integers",
    )
    os.symlink("loop", tmp_path / "loop")
    assert_one_line_error(
        ats_infer("quantize", tmp_path / "loop", "--bits", "8", "--out", tmp_path / "q"),
        "not a model directory (it is a symlink loop)",
    )
    assert not (tmp_path / "q").exists() and not (tmp_path / "m.gguf").exists()


def test_outputs_are_replaced_only_with_force(dense_dir, tmp_path, ats_infer) -> None:
    other = tmp_path / "other"
    shutil.copytree(dense_dir, other)
    weights = (other / "model.safetensors").read_bytes()
    assert_one_line_error(
        ats_infer("quantize", dense_dir, "--bits", "8", "--out", other), "pass --force"
    )
    assert (other / "model.safetensors").read_bytes() == weights
    result = ats_infer("quantize", dense_dir, "--bits", "8", "--out", other, "--force")
    assert result.returncode == 0, result.stderr
    assert (other / "quantization.json").is_file()
    source = dense_dir / "model.safetensors"
    before = source.read_bytes()
    assert_one_line_error(
        ats_infer("export-gguf", dense_dir, "--out", source, "--force"), "is the input"
    )
    assert source.read_bytes() == before


@pytest.mark.parametrize("engine", ["torch", "native"])
def test_threads_and_seed_out_of_range_exit_with_one_line(
    trained_dense_dir, engine, ats_infer
) -> None:
    """--threads 100000 once started >32k threads; a negative --seed was a nanobind TypeError
    (test_engine.py checks the bounds themselves)."""
    if engine == "native":
        pytest.importorskip("ats_native")
    args = ["generate", trained_dense_dir, "--prompt", "x", "--engine", engine]
    assert_one_line_error(
        ats_infer(*args, "--threads", "100000"),
        f"threads = 100000: expected an integer 0 (all cores) to {4 * os.cpu_count()}",
    )
    assert_one_line_error(
        ats_infer(*args, "--seed", "-1"), "seed = -1: expected an integer 0 to 2**64 - 1"
    )
