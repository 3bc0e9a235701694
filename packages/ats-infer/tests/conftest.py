"""Shared fixtures: a byte-level BPE tokenizer and small ATS model directories built from the Python
standard library's own source files (no network, nothing shipped), and `oracle`: the torch
reference (ats-model's eval forward over any float state dict, e.g. the one a quantized directory
stands for) with perplexity and top-1 agreement; `ats_infer`: the CLI's main run in this process.

`trained_dense_dir` is a tiny dense model trained for 120 CPU steps so that its predictions mean
something (held-out perplexity ~65, against 512 for a uniform guess): quantization quality is
measured on it, never on random weights, whose near-uniform outputs hide errors.
"""

import dataclasses
import io
import logging
import math
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from ats_infer.model_dir import read_config

STDLIB = Path(sysconfig.get_paths()["stdlib"])
VOCAB = 512
TRAIN_STEPS = 120
BATCH, SEQ = 16, 64


def stdlib_text(first: int, last: int) -> str:
    files = sorted(STDLIB.glob("*.py"))[first:last]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


@pytest.fixture(scope="session")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ats_tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    Tokenizer.train([stdlib_text(0, 40)], VOCAB).save(path)
    return path


@pytest.fixture(scope="session")
def held_out_ids(tokenizer_json: Path) -> np.ndarray:
    """(8, 129) token ids of stdlib files the model never trained on."""
    from ats_tokenizer import Tokenizer

    ids = Tokenizer.load(tokenizer_json).encode(stdlib_text(100, 104))
    return np.array(ids[: 8 * 129], dtype=np.int64).reshape(8, 129)


def save_random_model(preset: str, directory: Path, tokenizer_json: Path, **changes) -> Path:
    import torch
    from ats_model import build_model, presets, save_pretrained

    torch.manual_seed(0)
    config = dataclasses.replace(presets.get(preset), **changes)
    return save_pretrained(build_model(config), directory, tokenizer_json=tokenizer_json)


@pytest.fixture(scope="session")
def make_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_json: Path):
    """make_model_dir(preset, **ModelConfig changes) -> a fresh random-init model directory."""

    def make(preset: str, **changes) -> Path:
        out = tmp_path_factory.mktemp(preset)
        return save_random_model(preset, out, tokenizer_json, **changes)

    return make


@pytest.fixture(scope="session")
def dense_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_json: Path) -> Path:
    """Random-init tiny dense model, untied head (so output.weight is quantized too)."""
    out = tmp_path_factory.mktemp("dense")
    return save_random_model("tiny-dense", out, tokenizer_json, tie_embeddings=False)


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_json: Path) -> Path:
    out = tmp_path_factory.mktemp("moe")
    return save_random_model("tiny-moe", out, tokenizer_json, tie_embeddings=False)


@pytest.fixture(scope="session")
def trained_dense_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_json: Path) -> Path:
    import torch
    from ats_model import build_model, presets, save_pretrained
    from ats_tokenizer import Tokenizer

    ids = torch.tensor(Tokenizer.load(tokenizer_json).encode(stdlib_text(40, 70)))
    torch.manual_seed(0)
    config = dataclasses.replace(presets.get("tiny-dense"), tie_embeddings=False)
    model = build_model(config)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: extra threads only add contention
    for _ in range(TRAIN_STEPS):
        starts = torch.randint(0, len(ids) - SEQ - 1, (BATCH,), generator=gen)
        window = torch.stack([ids[s : s + SEQ + 1] for s in starts.tolist()])  # (B, T+1)
        loss = model(window[:, :-1], targets=window[:, 1:]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    return save_pretrained(model, tmp_path_factory.mktemp("trained"), tokenizer_json=tokenizer_json)


def perplexity(logits: np.ndarray, ids: np.ndarray) -> float:
    """exp(mean cross-entropy) of logits (B, T, V) predicting ids[:, 1:T+1] (float64 math)."""
    logits = logits.astype(np.float64)
    targets = ids[:, 1 : logits.shape[1] + 1]
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return math.exp(float(np.mean(logz - picked)))


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a.argmax(-1) == b.argmax(-1)))


def torch_logits(model_dir: Path, state: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Logits (B, T, V) float32 of ats-model built from model_dir's config.json with `state`."""
    import torch
    from ats_model import ModelConfig, build_model

    config = ModelConfig.from_dict(read_config(model_dir))
    model = build_model(config, kernels="reference")
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.float().numpy()


@pytest.fixture(scope="session")
def oracle() -> SimpleNamespace:
    return SimpleNamespace(
        torch_logits=torch_logits, perplexity=perplexity, top1_agreement=top1_agreement
    )


@dataclasses.dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def ats_infer(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., CliResult]:
    """ats_infer(*args, stdin="") -> what `ats-infer ARGS` exits with and prints, run by cli.main
    in this process with `stdin` as its standard input (argparse's SystemExit is the exit status;
    main's logging handler and torch's thread count are put back afterwards)."""
    import torch
    from ats_infer.cli import main

    def run(*args: object, stdin: str = "") -> CliResult:
        logger = logging.getLogger("ats_infer")
        handlers, threads = list(logger.handlers), torch.get_num_threads()
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:
            code = exit_.code
        finally:
            logger.handlers[:] = handlers
            torch.set_num_threads(threads)
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run
