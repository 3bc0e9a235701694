"""Gopher repetition filters: each fraction on small texts against values worked out by hand,
and the paper's thresholds (Rae et al. 2021, table A1) as the defaults."""

import pytest
from ats_data.errors import DataError
from ats_data.repetition import (
    RepetitionConfig,
    dup_ngram_char_frac,
    duplicate_fractions,
    repetition_reason,
    top_ngram_char_frac,
)


def test_duplicate_line_and_paragraph_fractions():
    # lines a b a c a: the 2nd and 3rd "a" repeat; 2 of 5 lines, 2 of the text's 9 characters
    assert duplicate_fractions(["a", "b", "a", "c", "a"], 9) == (2 / 5, 2 / 9)
    assert duplicate_fractions([], 0) == (0.0, 0.0)


def test_top_ngram_char_fraction():
    words = "the cat the cat sat".split()
    # bigrams: (the cat) x2, (cat the), (cat sat); top: 6 word chars x 2 over 15 word chars
    assert top_ngram_char_frac(words, 2) == pytest.approx(12 / 15)
    assert top_ngram_char_frac("every word here differs".split(), 2) == 0.0  # no repeat
    assert top_ngram_char_frac(["one"], 2) == 0.0


def test_duplicate_ngram_char_fraction():
    words = "aa b c aa b dd".split()
    # (aa b) at 0 and 3 covers aa, b, aa, b: 6 of the 9 word characters
    assert dup_ngram_char_frac(words, 2) == pytest.approx(6 / 9)
    # overlapping repeats count each word once: x y x y x has (x y) at 0, 2 and (y x) at 1, 3
    assert dup_ngram_char_frac("x y x y x".split(), 2) == 1.0
    assert dup_ngram_char_frac("p q r s t u".split(), 5) == 0.0


def test_defaults_are_the_papers_and_reasons_name_the_test():
    config = RepetitionConfig()
    assert (config.dup_line_frac, config.dup_para_frac) == (0.30, 0.30)
    assert (config.dup_line_char_frac, config.dup_para_char_frac) == (0.20, 0.20)
    assert config.top_ngram_char_frac == ((2, 0.20), (3, 0.18), (4, 0.16))
    assert [f for _, f in config.dup_ngram_char_frac] == [0.15, 0.14, 0.13, 0.12, 0.11, 0.10]
    prose = " ".join(f"w{i}" for i in range(60))
    assert repetition_reason(prose, config) is None
    # 2 of 4 lines repeat the first: 0.5 > 0.30
    assert repetition_reason("home\nhome\nhome\n" + prose, config) == "duplicate_line_fraction"
    # one repeated long paragraph among distinct short lines: 1/5 lines but its characters
    para = " ".join(f"p{i}" for i in range(40))
    text = f"{para}\n\nx1\n\nx2\n\nx3\n\n{para}"
    assert repetition_reason(text, config) == "duplicate_line_char_fraction"
    # a phrase repeated within one line: (buy now) x4 is 24 word chars, z0..z9 another 20
    spam = "buy now " * 4 + " ".join(f"z{i}" for i in range(10))
    assert top_ngram_char_frac(spam.split(), 2) == pytest.approx(24 / (24 + 20))
    assert repetition_reason(spam, config) == "top_2gram_char_fraction"


def test_bad_threshold():
    with pytest.raises(DataError, match="repetition threshold dup_line_frac must be in"):
        RepetitionConfig(dup_line_frac=1.5)
