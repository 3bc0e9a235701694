"""Shared fixtures: a tokenizer trained on a small standard-library slice (session-scoped)."""

from pathlib import Path

import numpy as np
import pytest
from ats_data.shards import ShardWriter, make_index, token_dtype_name, write_index
from ats_data.sources import open_source
from ats_tokenizer import Tokenizer

TOKENIZER_CORPUS = "stdlib:json"
TOKENIZER_VOCAB = 384


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory) -> Path:
    texts = list(open_source(TOKENIZER_CORPUS))
    tokenizer = Tokenizer.train(texts, vocab_size=TOKENIZER_VOCAB)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path):
    return Tokenizer.load(tokenizer_path)


def write_token_dataset(
    out_dir: Path,
    docs: dict[str, list[np.ndarray]],
    *,
    vocab_size: int,
    eos_id: int,
    shard_tokens: int = 1 << 20,
) -> Path:
    """A dataset folder from given token documents (each must end with eos_id), written by the
    same ShardWriter and index code prepare uses; for loader and dataset tests that need exact
    control of the token values."""
    dtype_name = token_dtype_name(vocab_size)
    shards = {}
    for split, split_docs in docs.items():
        writer = ShardWriter(out_dir, split, dtype_name, shard_tokens)
        for doc in split_docs:
            writer.add(np.asarray(doc))
        shards[split] = writer.close()
    index = make_index(
        tokenizer_sha256="0" * 64,
        vocab_size=vocab_size,
        eos_id=eos_id,
        dtype_name=dtype_name,
        shards=shards,
        source="test",
        cache_key="test",
        config={},
        stats={},
    )
    write_index(out_dir, index)
    return out_dir


@pytest.fixture
def make_token_dataset():
    return write_token_dataset
