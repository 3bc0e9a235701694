"""Pre-tokenization: the two named patterns against HF `tokenizers` (Oniguruma) and, when built,
ats_native; the Unicode-version difference between the engines, found exactly; lone surrogates."""

import importlib.util

import pytest
import regex
from ats_tokenizer.bytelevel import unicode_str_to_bytes
from ats_tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN, pretokenize
from ats_tokenizer_inputs import UNICODE_17_RANGES, any_text, oracle_text
from hypothesis import given, settings
from tokenizers import Regex, pre_tokenizers

HAS_NATIVE = importlib.util.find_spec("ats_native") is not None
ALL_CHARS = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)


def hf_split(pattern: str, text: str) -> list[str]:
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return [piece for piece, _ in split.pre_tokenize_str(text)]


@settings(max_examples=150, deadline=None)
@given(text=oracle_text)
def test_gpt4_split_matches_hf(text):
    assert pretokenize(text, GPT4_PATTERN) == hf_split(GPT4_PATTERN, text)


@settings(max_examples=150, deadline=None)
@given(text=oracle_text)
def test_gpt2_split_matches_hf_bytelevel(text):
    # HF's ByteLevel(use_regex=true) applies its built-in GPT-2 regex and maps bytes to unicode.
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf = [unicode_str_to_bytes(p) for p, _ in byte_level.pre_tokenize_str(text)]
    assert [p.encode("utf-8") for p in pretokenize(text, GPT2_PATTERN)] == hf


@pytest.mark.slow
def test_engines_differ_exactly_on_unicode_17_letters_and_numbers():
    """Classify every code point with both engines: the only difference is the documented set."""
    ours = set(regex.findall(r"[\p{L}\p{N}]", ALL_CHARS))
    removed = pre_tokenizers.Split(Regex(r"[\p{L}\p{N}]"), behavior="removed")
    kept = "".join(p for p, _ in removed.pre_tokenize_str(ALL_CHARS))
    hf = set(ALL_CHARS) - set(kept)
    documented = {chr(c) for lo, hi in UNICODE_17_RANGES for c in range(lo, hi + 1)}
    assert hf - ours == set()
    assert ours - hf == documented
    # \s agrees everywhere.
    ws_kept = pre_tokenizers.Split(Regex(r"\s"), behavior="removed").pre_tokenize_str(ALL_CHARS)
    assert set(regex.findall(r"\s", ALL_CHARS)) == set(ALL_CHARS) - set(
        "".join(p for p, _ in ws_kept)
    )


def test_documented_mismatch_is_real():
    # U+323B0 (CJK Extension J, Unicode 17.0): a letter for `regex`, not for HF.
    text = "a\U000323b0b"
    assert pretokenize(text, GPT4_PATTERN) == [text]
    assert hf_split(GPT4_PATTERN, text) != [text]


@pytest.mark.parametrize("pattern", [GPT4_PATTERN, GPT2_PATTERN])
def test_lone_surrogate_is_a_clear_error(pattern):
    with pytest.raises(ValueError, match="lone surrogate at index 3"):
        pretokenize("abc\ud800def", pattern)


def test_invalid_pattern_is_a_clear_error():
    with pytest.raises(ValueError, match="invalid pre-tokenization pattern"):
        pretokenize("x", "(unclosed")


@pytest.mark.skipif(not HAS_NATIVE, reason="ats_native is not built")
@settings(max_examples=300, deadline=None)
@given(text=any_text)
def test_native_pretokenize_matches_regex(text):
    import ats_native

    assert ats_native.pretokenize(text, "gpt4") == regex.findall(GPT4_PATTERN, text)
    assert ats_native.pretokenize(text, "gpt2") == regex.findall(GPT2_PATTERN, text)


@pytest.mark.skipif(not HAS_NATIVE, reason="ats_native is not built")
def test_native_pretokenize_errors():
    import ats_native

    with pytest.raises(ValueError, match="lone surrogate at index 1"):
        ats_native.pretokenize("a\udc00", "gpt4")
    with pytest.raises(ValueError, match="gpt5"):
        ats_native.pretokenize("a", "gpt5")
