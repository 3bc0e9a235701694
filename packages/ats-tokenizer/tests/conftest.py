"""Shared fixtures of the ats-tokenizer tests: stdlib text slices and trained tokenizers.

Text inputs and hypothesis strategies live in ats_tokenizer_inputs.py (this folder is put on
sys.path so test modules can import it under --import-mode=importlib)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ats_tokenizer import GPT2_PATTERN, GPT4_PATTERN, Tokenizer  # noqa: E402
from ats_tokenizer_inputs import stdlib_texts  # noqa: E402


@pytest.fixture(scope="session")
def train_texts() -> list[str]:
    return stdlib_texts(30)


@pytest.fixture(scope="session")
def held_out_texts() -> list[str]:
    return stdlib_texts(5, start=100)


@pytest.fixture(scope="session", params=["gpt4", "gpt2"])
def trained(request, train_texts) -> Tokenizer:
    """ATS-trained (python reference trainer) tokenizer with chat specials, both patterns."""
    pattern = GPT4_PATTERN if request.param == "gpt4" else GPT2_PATTERN
    return Tokenizer.train(
        train_texts,
        1024,
        special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        pattern=pattern,
        backend="python",
    )


@pytest.fixture(scope="session")
def trained_tiktoken(trained: Tokenizer):
    """`trained` as a tiktoken Encoding (to_tiktoken), built once per pattern."""
    return trained.to_tiktoken()
