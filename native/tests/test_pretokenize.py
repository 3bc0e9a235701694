"""ats_native.pretokenize vs regex.findall with the reference patterns of ats_tokenizer, over
arbitrary and targeted Unicode text and the Python standard library's source."""

import sysconfig
from pathlib import Path

import ats_native
import pytest
import regex
from ats_tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN
from hypothesis import given, settings
from hypothesis import strategies as st

PATTERNS = {"gpt4": GPT4_PATTERN, "gpt2": GPT2_PATTERN}

# Characters and snippets where the two patterns branch: whitespace of every kind (regex's \s is
# not str.isspace: \x1c-\x1f differ), contractions with case variants (U+017F matches 's' under
# (?i) in regex), digits and numbers of many scripts, letters, emoji, combining marks, punctuation.
WHITESPACE = [" ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f"]
WHITESPACE += ["\x85", "\xa0", "\u1680", "\u2000", "\u200a", "\u200b", "\u2028", "\u2029"]
WHITESPACE += ["\u202f", "\u205f", "\u3000", "\ufeff"]
CONTRACTIONS = ["'", "'s", "'S", "'ſ", "'t", "'T", "'re", "'RE", "'rE", "'ve", "'Ve", "'m", "'M"]
CONTRACTIONS += ["'ll", "'LL", "'lL", "'d", "'D", "'r", "'l", "'v", "\u2019s", "'\u212a"]
DIGITS = ["0", "7", "42", "1234", "\u0663", "\u06f5", "\u07c0", "\u096a", "\u09e9", "\u0e53"]
DIGITS += ["\uff11", "\xb2", "\xbd", "\u216b", "\u2460", "\U0001d7d8", "\U00010107"]
LETTERS = ["a", "Z", "s", "t", "e", "x", "\xe9", "\u0436", "\u4e2d", "\ud55c", "\u3042", "\u05d0"]
LETTERS += ["\u0627", "\u02b0", "\u1100", "\u0301", "\u200d", "ſ", "K", "\u212a", "\U00020000"]
SYMBOLS = [".", ",", "!", "(", ")", "_", "#", "\\", '"', "-", "=", "\u2014", "\u20ac", "\U0001f600"]
SYMBOLS += ["\U0001f44d\U0001f3fd", "\u2764\ufe0f", "\x00", "\x7f", "\ue000", "\U0010ffff"]
SNIPPETS = WHITESPACE + CONTRACTIONS + DIGITS + LETTERS + SYMBOLS

targeted_text = st.lists(st.sampled_from(SNIPPETS), max_size=40).map("".join)
wide_text = st.text(max_size=60)
ascii_text = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=60)


def stdlib_text(n_chars: int) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    parts, total = [], 0
    for path in files:
        text = path.read_text("utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= n_chars:
            break
    return "".join(parts)[:n_chars]


@pytest.mark.parametrize("name", ["gpt4", "gpt2"])
@settings(max_examples=300, deadline=None)
@given(text=st.one_of(targeted_text, wide_text, ascii_text))
def test_matches_regex_findall(name: str, text: str) -> None:
    assert ats_native.pretokenize(text, name) == regex.findall(PATTERNS[name], text)


@pytest.mark.parametrize("name", ["gpt4", "gpt2"])
def test_every_code_point_alone_and_in_context(name: str) -> None:
    # each code point (surrogates excluded) alone, after a space, between letters, and after an
    # apostrophe (every case-insensitive contraction letter), then 're / 'll with it as 2nd letter
    chars = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    for cps in (chars[i : i + 4096] for i in range(0, len(chars), 4096)):
        text = "".join(c + " " + c + "a" + c + "'s'" + c + "'r" + c + "'l" + c + "\n" for c in cps)
        assert ats_native.pretokenize(text, name) == regex.findall(PATTERNS[name], text)


@pytest.mark.parametrize("name", ["gpt4", "gpt2"])
def test_stdlib_source(name: str) -> None:
    text = stdlib_text(2_000_000)
    assert ats_native.pretokenize(text, name) == regex.findall(PATTERNS[name], text)


def test_long_runs() -> None:
    text = "a" * 100_000 + " " * 50_000 + "1" * 10 + "\n" * 7 + "." * 1000 + "\u3000" * 3
    for name, pattern in PATTERNS.items():
        assert ats_native.pretokenize(text, name) == regex.findall(pattern, text)


def test_unknown_pattern_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'cl100k'.*'gpt4' and 'gpt2'"):
        ats_native.pretokenize("hello", "cl100k")


def test_lone_surrogate_names_its_index() -> None:
    with pytest.raises(ValueError, match="lone surrogate at index 3"):
        ats_native.pretokenize("abc\ud800def", "gpt4")


def test_non_str_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="text must be str"):
        ats_native.pretokenize(b"abc", "gpt4")
