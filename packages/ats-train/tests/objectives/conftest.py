"""A tiny base model directory (dense, with a ChatML tokenizer) and TRL-format row files for the
post-training tests."""

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ats_model import ModelConfig, build_model
from ats_model.serialization.model_dir import save_pretrained
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS

sys.path.insert(0, str(Path(__file__).parent))  # trl_oracle.py, imported by the test modules

TEXT = "\n".join(f"What is {a} plus {b}? answer: {a + b}" for a in range(30) for b in range(7))


def tiny_config(vocab_size: int, family: str = "dense") -> ModelConfig:
    return ModelConfig(
        family=family, vocab_size=vocab_size, dim=32, n_layer=2, n_head=2, n_kv_head=1,
        ffn_dim=64, max_seq_len=128,
    )  # fmt: skip


def make_model_dir(root: Path, specials: tuple[str, ...] = CHAT_SPECIAL_TOKENS) -> Path:
    tok = Tokenizer.train(iter([TEXT]), 300, special_tokens=specials)
    root.mkdir(parents=True, exist_ok=True)
    tok.save(root / "tokenizer.json")
    torch.manual_seed(0)
    model = build_model(tiny_config(tok.vocab_size))
    return save_pretrained(model, root / "model", root / "tokenizer.json")


@pytest.fixture(scope="session")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("base"))


def problems(n: int, seed: int = 0) -> list[tuple[str, int]]:
    g = torch.Generator().manual_seed(seed)
    pairs = torch.randint(0, 50, (n, 2), generator=g).tolist()
    return [(f"What is {a} plus {b}?", a + b) for a, b in pairs]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_rows(directory: Path, kind: str) -> Path:
    """directory/KIND.jsonl: 24 rows of kind sft-messages, sft-prompt, sft-text, dpo or grpo."""
    ps = problems(24)
    if kind == "sft-messages":
        rows = [{"messages": [{"role": "user", "content": q},
                              {"role": "assistant", "content": f"answer: {a}"}]} for q, a in ps]  # fmt: skip
    elif kind == "sft-prompt":
        rows = [{"prompt": q, "completion": f" answer: {a}"} for q, a in ps]
    elif kind == "sft-text":
        rows = [{"text": f"{q} answer: {a}"} for q, a in ps]
    elif kind == "dpo":
        rows = [{"prompt": q, "chosen": f" answer: {a}", "rejected": f" answer: {a + 1}"}
                for q, a in ps]  # fmt: skip
    else:
        rows = [{"prompt": q, "answer": str(a)} for q, a in ps]
    return write_jsonl(directory / f"{kind}.jsonl", rows)


@pytest.fixture
def rows_file(tmp_path: Path) -> Callable[[str], Path]:
    """rows_file(kind) -> write_rows(tmp_path, kind)."""
    return lambda kind: write_rows(tmp_path, kind)


def post_overrides(model_dir: Path, data: Path, **extra: object) -> list[str]:
    values = {
        "model.init_from": model_dir,
        "data.source": data,
        "data.val_fraction": 0.25,
        "train.steps": 4,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "train.seq_len": 64,
        "train.eval_every": 2,
        "train.log_every": 1,
        "train.sample_tokens": 0,
        "train.device": "cpu",
        "optim.warmup_steps": 1,
        "checkpoint.every": 2,
        "kernels": "reference",
        "grpo.group_size": 4,
        "grpo.max_completion_tokens": 8,
    }
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in values.items()]
