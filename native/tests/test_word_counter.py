"""ats_native.WordCounter vs the reference ats_tokenizer.train.WordCounter: counts (any thread
count, several add calls), the prune rule, and input checks."""

import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ats_native
import pytest
from ats_tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN
from ats_tokenizer.train import WordCounter as RefWordCounter
from hypothesis import given, settings
from hypothesis import strategies as st

PATTERNS = {"gpt4": GPT4_PATTERN, "gpt2": GPT2_PATTERN}


def stdlib_texts(n_files: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return [p.read_text("utf-8", errors="replace") for p in files[:n_files]]


@pytest.mark.parametrize("name", ["gpt4", "gpt2"])
def test_counts_and_prune_match_reference(name: str) -> None:
    texts = stdlib_texts(30)
    ref = RefWordCounter(PATTERNS[name])
    ref.add(texts)
    ours = ats_native.WordCounter(name)
    ours.add(texts[:10], threads=1)
    ours.add(texts[10:], threads=2)
    assert ours.counts() == ref.counts()
    assert len(ours) == len(ref)
    for max_words in (100_000, 5000, 1000, 10, 0):
        ref.prune(max_words)
        ours.prune(max_words)
        assert ours.counts() == ref.counts()


@settings(max_examples=100, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="ab \n'1.", max_size=30), max_size=8),
    max_words=st.integers(0, 12),
    threads=st.integers(0, 3),
)
def test_prune_rule_on_small_counts(texts: list[str], max_words: int, threads: int) -> None:
    ref = RefWordCounter(GPT4_PATTERN)
    ref.add(texts)
    ours = ats_native.WordCounter("gpt4")
    ours.add(texts, threads=threads)
    ref.prune(max_words)
    ours.prune(max_words)
    assert ours.counts() == ref.counts()
    assert ours.train(10, 1) == ref.train(10, 1)


def test_word_counter_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="unknown pattern 'gpt5'"):
        ats_native.WordCounter("gpt5")
    counter = ats_native.WordCounter("gpt2")
    with pytest.raises(ValueError, match=r"texts\[0\] contains a lone surrogate at index 2"):
        counter.add(["ab\udc80"])
    with pytest.raises(ValueError, match="max_words must be >= 0"):
        counter.prune(-1)
    with pytest.raises(ValueError, match=r"threads = -2: expected 0 \(all"):
        counter.add(["a"], threads=-2)


def test_concurrent_adds_from_python_threads() -> None:
    # add() releases the GIL; calls on one counter from several threads must not race
    texts = stdlib_texts(24)
    serial = ats_native.WordCounter("gpt4")
    serial.add(texts)
    shared = ats_native.WordCounter("gpt4")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: shared.add(texts[i::4], threads=2), range(4)))
    assert shared.counts() == serial.counts()


def test_huge_n_merges_stops_when_no_pair_is_left() -> None:
    counter = ats_native.WordCounter("gpt4")
    counter.add(["abcabc abcabc"])
    assert counter.train(10**15, 1) == ats_native.train_bpe(counter.counts(), 10**15, 1)
    assert ats_native.train_bpe({b"abcabc": 3}, 10**15, 1) == [(97, 98), (256, 99), (257, 257)]
