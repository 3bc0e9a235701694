"""The byte <-> unicode map equals HF's ByteLevel alphabet and mapping, and round-trips."""

import pytest
from ats_tokenizer.bytelevel import BYTE_TO_UNICODE, bytes_to_unicode_str, unicode_str_to_bytes
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers


def test_alphabet_matches_hf():
    assert sorted(BYTE_TO_UNICODE.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())


@settings(max_examples=100, deadline=None)
@given(text=st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30))
def test_mapping_matches_hf_bytelevel(text):
    hf = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    [(mapped, _)] = hf.pre_tokenize_str(text)
    assert mapped == bytes_to_unicode_str(text.encode("utf-8"))


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=64))
def test_round_trip(data):
    assert unicode_str_to_bytes(bytes_to_unicode_str(data)) == data


def test_foreign_character_is_a_clear_error():
    with pytest.raises(ValueError, match="not in the ByteLevel alphabet"):
        unicode_str_to_bytes("a\u4e00")
