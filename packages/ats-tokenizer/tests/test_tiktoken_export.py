"""tiktoken built from ATS (to_tiktoken) encodes and decodes identically."""

import pytest
from ats_tokenizer import Tokenizer
from ats_tokenizer_inputs import oracle_text
from hypothesis import given, settings


@settings(max_examples=150, deadline=None)
@given(text=oracle_text)
def test_tiktoken_encodes_identically(trained, trained_tiktoken, text):
    enc = trained_tiktoken
    ids = trained.encode(text, allowed_special="all")
    assert enc.encode(text, allowed_special="all") == ids
    assert enc.encode_ordinary(text) == trained.encode_ordinary(text)
    assert enc.decode(ids) == trained.decode(ids)


def test_held_out_source_identical(trained, trained_tiktoken, held_out_texts):
    enc = trained_tiktoken
    assert enc.n_vocab == trained.vocab_size
    assert enc.eot_token == trained.eos_id
    for text in held_out_texts:
        assert enc.encode_ordinary(text) == trained.encode_ordinary(text)


def test_shuffled_ids_are_refused(trained):
    ids = list(range(256))
    ids[0], ids[1] = 1, 0
    swapped = Tokenizer(ids, [], {}, trained.pattern, backend="python")
    with pytest.raises(ValueError, match="ids are not in merge order.*byte 0x00"):
        swapped.to_tiktoken()
