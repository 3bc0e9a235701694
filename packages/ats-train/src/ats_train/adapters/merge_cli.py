"""`ats-train merge-adapter --model DIR --adapter DIR --out DIR`: a new model directory with the
adapter merged into the weights (or a router adapter's routers in place). The merge runs in
float32 and is saved in the model's own dtype; `out` must be new and is written under a temporary
name beside it, then renamed: neither input is ever written to."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
from ats_model import load_pretrained, save_pretrained
from ats_model.adapters import merge_adapter_into
from ats_model.serialization.model_dir import TOKENIZER_FILE, model_dtype

from ats_train.errors import InputError


def merge_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ats-train merge-adapter",
        description="Merge an adapter (run_dir/adapter) into a model directory, as a new one.",
    )
    parser.add_argument("--model", type=Path, required=True, help="the base model directory")
    parser.add_argument("--adapter", type=Path, required=True, help="the adapter directory")
    parser.add_argument("--out", type=Path, required=True, help="the new model directory")
    return parser


def check_out(out: Path, inputs: list[Path]) -> None:
    """`out` must not exist, and must lie inside neither input."""
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"--out {out} exists; merge-adapter writes a new directory only")
    for given in inputs:
        if out.resolve().is_relative_to(given.resolve()):
            raise InputError(f"--out {out} lies inside the input {given}; choose another place")


def merge_adapter(model_dir: Path, adapter_dir: Path, out: Path) -> Path:
    check_out(out, [model_dir, adapter_dir])
    try:
        model = load_pretrained(model_dir)
        saved_dtype = model_dtype(model)
        merge_adapter_into(model.to(torch.float32), adapter_dir).to(saved_dtype)
    except ValueError as e:  # what ats_model says of a bad directory: one line, exit 2
        raise InputError(str(e)) from e
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tokenizer = model_dir / TOKENIZER_FILE
        save_pretrained(model, tmp, tokenizer if tokenizer.is_file() else None)
        check_out(out, [])  # still new: nothing written meanwhile is replaced
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
