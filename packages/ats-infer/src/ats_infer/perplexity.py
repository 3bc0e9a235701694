"""Perplexity and bits per byte of a model on token windows (corpus.py), through any engine:

    nll           = sum over predicted tokens of -log p(token | the window's tokens before it), nats
    ppl           = exp(nll / tokens)
    bits_per_byte = nll / ln 2 / bytes    (UTF-8 bytes of the predicted text: tokenizer-independent)

Log-softmax in float64 over the engine's float32 logits.
"""

import math
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from ats_tokenizer import Tokenizer

from ats_infer.corpus import DEFAULT_VAL_FRACTION, Windows, split_documents, token_windows
from ats_infer.engine import engine_for, load_engine
from ats_infer.model_dir import read_config
from ats_infer.tensor_files import TOKENIZER_FILE, path_kind

DEFAULT_MAX_TOKENS = 32768


class ScoresLogits(Protocol):
    def logits(self, ids: np.ndarray) -> np.ndarray: ...  # (B, T) -> (B, T, V) float32


def window_nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed -log softmax(logits)[target] of logits (B, T, V) and targets (B, T), nats."""
    z = logits.astype(np.float64)
    peak = z.max(-1, keepdims=True)
    log_norm = np.log(np.exp(z - peak).sum(-1)) + peak[..., 0]  # (B, T)
    picked = np.take_along_axis(z, targets[..., None], axis=-1)[..., 0]  # (B, T)
    return float((log_norm - picked).sum())


def evaluate(engine: ScoresLogits, windows: Windows, batch_size: int = 8) -> dict[str, Any]:
    if batch_size < 1:
        raise ValueError(f"batch_size = {batch_size} must be >= 1")
    nll = 0.0
    for b in range(0, windows.ids.shape[0], batch_size):
        batch = windows.ids[b : b + batch_size]  # (B, T + 1)
        nll += window_nll(engine.logits(batch[:, :-1]), batch[:, 1:])
    return {
        "ppl": math.exp(nll / windows.n_tokens),
        "bits_per_byte": nll / math.log(2) / windows.n_bytes,
        "nll_per_token": nll / windows.n_tokens,
        "tokens": windows.n_tokens,
        "bytes": windows.n_bytes,
        "documents": windows.n_documents,
        "seq_len": windows.ids.shape[1] - 1,
    }


def eval_ppl(
    model_dir: str | Path,
    data: str,
    *,
    engine: str = "auto",
    seq_len: int | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    batch_size: int = 8,
    threads: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Perplexity of model directory `model_dir` on the held-out ("val") documents of `data`
    (a path or "stdlib"), in windows of `seq_len` tokens (default: min(max_seq_len, 1024))."""
    config = read_config(model_dir)
    if seq_len is None:
        seq_len = min(config["max_seq_len"], 1024)
    if not 1 <= seq_len <= config["max_seq_len"]:
        raise ValueError(
            f"seq_len = {seq_len}: expected 1 to the model's max_seq_len {config['max_seq_len']}"
        )
    tokenizer_path = Path(model_dir) / TOKENIZER_FILE
    if path_kind(tokenizer_path) != "file":
        raise FileNotFoundError(f"{model_dir}: no {TOKENIZER_FILE} beside the weights")
    tokenizer = Tokenizer.load(tokenizer_path)
    documents = split_documents(data, "val", val_fraction)
    windows = token_windows(tokenizer, documents, seq_len, max_tokens)
    chosen = engine_for(model_dir, engine)
    model = load_engine(model_dir, chosen, device=device, threads=threads)
    return {"engine": chosen, **evaluate(model, windows, batch_size)}
