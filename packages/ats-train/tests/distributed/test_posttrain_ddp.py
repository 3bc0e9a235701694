"""`ats-train sft` and `dpo` on 2 gloo ranks (torchrun, ddp and fsdp2) against the single-process
run: the same global batches (each rank takes its share of the loader's permutation), so the same
losses and DPO reward metrics to float summation order (test_backends.py gives the tolerance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ats_model import ModelConfig, build_model
from ats_model.serialization.model_dir import save_pretrained
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS
from ats_train_torchrun import run_ats_train, train_records

pytestmark = [pytest.mark.dist, pytest.mark.slow]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("post")
    text = "\n".join(f"What is {a} plus {b}? answer: {a + b}" for a in range(20) for b in range(9))
    tok = Tokenizer.train(iter([text]), 300, special_tokens=CHAT_SPECIAL_TOKENS)
    tok.save(root / "tokenizer.json")
    torch.manual_seed(0)
    config = ModelConfig(family="dense", vocab_size=tok.vocab_size, dim=32, n_layer=2, n_head=2,
                         n_kv_head=1, ffn_dim=64, max_seq_len=64)  # fmt: skip
    model_dir = save_pretrained(build_model(config), root / "model", root / "tokenizer.json")
    sft, dpo = root / "sft.jsonl", root / "dpo.jsonl"
    rows = [(f"What is {a} plus {b}?", a + b) for a in range(8) for b in range(4)]
    sft.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                   {"role": "assistant", "content": f"answer: {s}"}]}) + "\n" for q, s in rows))  # fmt: skip
    dpo.write_text("".join(json.dumps({"prompt": q, "chosen": f" answer: {s}",
                   "rejected": f" answer: {s + 1}"}) + "\n" for q, s in rows))  # fmt: skip
    return model_dir, sft, dpo


def _args(command: str, model_dir: Path, data: Path, run_dir: Path, **extra: object) -> list[str]:
    values = {
        "model.init_from": model_dir, "data.source": data, "data.val_fraction": 0.25,
        "train.steps": 4, "train.batch_size": 4, "train.micro_batch_size": 2, "train.seq_len": 64,
        "train.eval_every": 2, "train.log_every": 1, "train.sample_tokens": 0,
        "train.device": "cpu", "optim.warmup_steps": 1, "checkpoint.every": 2,
        "kernels": "reference", **{k.replace("__", "."): v for k, v in extra.items()},
    }  # fmt: skip
    return [command, "--run-dir", str(run_dir), *(f"{k}={v}" for k, v in values.items())]


def _ok(proc) -> None:  # noqa: ANN001
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def single_runs(setup, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, dict]]:
    """command -> the train records of its single-process run, made once for every backend."""
    model_dir, sft, dpo = setup
    records = {}
    for command, data in (("sft", sft), ("dpo", dpo)):
        run_dir = tmp_path_factory.mktemp(f"single-{command}")
        _ok(run_ats_train(_args(command, model_dir, data, run_dir), nproc=None))
        records[command] = train_records(run_dir)
    return records


@pytest.mark.parametrize(("command", "backend"), [("sft", "ddp"), ("sft", "fsdp2"), ("dpo", "ddp")])
def test_two_ranks_reproduce_the_single_process_run(
    setup, single_runs, tmp_path, command, backend
) -> None:
    model_dir, sft, dpo = setup
    data = sft if command == "sft" else dpo
    multi = tmp_path / "multi"
    _ok(run_ats_train(_args(command, model_dir, data, multi, parallel__backend=backend), nproc=2))
    want, got = single_runs[command], train_records(multi)
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]
    keys = ["loss"] + (["rewards/margins", "rewards/accuracies"] if command == "dpo" else [])
    for step in want:
        for key in keys:
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-5, abs=1e-7), (step, key)
