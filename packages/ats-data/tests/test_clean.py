"""Cleaning against a plain character-by-character reference: NFC, control characters gone
except newline and tab, length bounds."""

import unicodedata

import pytest
from ats_data.clean import CleanConfig, Cleaner, clean_text
from ats_data.errors import DataError
from hypothesis import given
from hypothesis import strategies as st


def reference_clean(text: str) -> str:
    kept = "".join(c for c in text if c in "\n\t" or unicodedata.category(c) != "Cc")
    return unicodedata.normalize("NFC", kept)


def test_examples():
    assert clean_text("a\r\nb\x00c\td\x7f\x85e") == "a\nbc\tde"
    assert clean_text("e\u0301") == "\u00e9"  # decomposed -> composed
    assert clean_text("e\x00\u0301") == "\u00e9"  # control removed before composing
    assert (
        clean_text("\u200b zero-width stays (Cf, not Cc)") == "\u200b zero-width stays (Cf, not Cc)"
    )


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_matches_reference(text):
    cleaned = clean_text(text)
    assert cleaned == reference_clean(text)
    assert clean_text(cleaned) == cleaned  # idempotent


def test_length_filter_counts_drops():
    cleaner = Cleaner(CleanConfig(min_chars=3, max_chars=5))
    out = [cleaner(t) for t in ["ab", "abc", "a\x00\x01bc", "abcde", "abcdef", ""]]
    assert out == [None, "abc", "abc", "abcde", None, None]
    assert (cleaner.dropped_short, cleaner.dropped_long) == (2, 1)


def test_bad_bounds():
    with pytest.raises(DataError, match="min_chars must be >= 0"):
        CleanConfig(min_chars=-1)
    with pytest.raises(DataError, match="max_chars must be >= max"):
        CleanConfig(min_chars=10, max_chars=5)
