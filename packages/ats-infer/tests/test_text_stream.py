"""The engines' shared prompt check and text streaming, against the tokenizer's own decode."""

from pathlib import Path

import pytest
from ats_infer.text_stream import encode_prompt, stream_text
from ats_tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tokenizer_json: Path) -> Tokenizer:
    return Tokenizer.load(tokenizer_json)


def test_stream_joins_to_decode_and_stops_at_eos(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("def f(x):\n    return 'héllo 🙂'\n")
    pieces = list(stream_text(tokenizer, [*ids, tokenizer.eos_id, *ids], stop=()))
    assert "".join(pieces) == tokenizer.decode(ids)


def test_stream_ends_once_a_stop_string_appears(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("first line\nsecond line\n")
    text = "".join(stream_text(tokenizer, ids, stop=["\n"]))
    assert text.startswith("first line\n") and "second" not in text


def test_an_id_beyond_the_tokenizer_is_a_clear_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match=rf"token id {tokenizer.vocab_size}, which tokenizer.json"):
        list(stream_text(tokenizer, [tokenizer.vocab_size], stop=()))


def test_prompt_checks(tokenizer: Tokenizer) -> None:
    assert encode_prompt(tokenizer, "x = 1", tokenizer.vocab_size) == tokenizer.encode("x = 1")
    with pytest.raises(ValueError, match="empty after tokenization"):
        encode_prompt(tokenizer, "", tokenizer.vocab_size)
    with pytest.raises(ValueError, match="out of the model's vocab"):
        encode_prompt(tokenizer, "x = 1", 3)
