"""Reference trainer: the incremental heap trainer equals a naive recount-everything trainer; the
prune rule; determinism across runs and processes (stdlib slice, vocab 4096); native agreement."""

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from ats_tokenizer import GPT2_PATTERN, GPT4_PATTERN, Tokenizer
from ats_tokenizer.bpe import merge_pair
from ats_tokenizer.train import WordCounter, train_bpe
from ats_tokenizer_inputs import any_text, stdlib_texts
from hypothesis import given, settings
from hypothesis import strategies as st

HAS_NATIVE = importlib.util.find_spec("ats_native") is not None
needs_native = pytest.mark.skipif(not HAS_NATIVE, reason="ats_native is not built")


def naive_train(counts: dict[bytes, int], n_merges: int, min_frequency: int):
    """The contract written as plainly as possible: recount every pair at every step."""
    words = {tuple(w): c for w, c in counts.items()}
    merges = []
    for step in range(n_merges):
        pairs: Counter = Counter()
        for ids, c in words.items():
            for pair in zip(ids, ids[1:], strict=False):
                pairs[pair] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < min_frequency:
            break
        merges.append(best)
        merged: Counter = Counter()
        for ids, c in words.items():
            merged[tuple(merge_pair(ids, best, 256 + step))] += c
        words = merged
    return merges


counts_strategy = st.dictionaries(
    st.binary(min_size=1, max_size=8).map(lambda b: bytes(x % 4 + 97 for x in b)),
    st.integers(1, 20),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(counts=counts_strategy, min_frequency=st.integers(1, 4))
def test_incremental_trainer_equals_naive(counts, min_frequency):
    assert train_bpe(counts, 40, min_frequency) == naive_train(counts, 40, min_frequency)


def test_overlapping_pairs_are_counted_and_merged_left_to_right():
    # "aaa" holds (a, a) twice (overlapping); with count 1 that is 2 >= min_frequency 2.
    assert train_bpe({b"aaa": 1}, 5, 2) == [(97, 97)]
    assert train_bpe({b"ab": 3, b"ba": 3}, 1, 1) == [(97, 98)]  # tie -> smallest pair


def test_prune_rule():
    counter = WordCounter(GPT4_PATTERN)
    counter.add(["a a a b b c d e"])  # words: a x1, " a" x2, " b" x2, " c", " d", " e"
    counter.prune(10)
    assert len(counter) == 6
    counter.prune(3)  # drop count <= 1 -> {" a", " b"}: 2 <= 3
    assert counter.counts() == {b" a": 2, b" b": 2}
    counter.prune(0)
    assert counter.counts() == {}


def test_min_frequency_stops_training(train_texts):
    tok = Tokenizer.train(train_texts[:3], 50_000, min_frequency=50, backend="python")
    assert 256 < tok.vocab_size < 50_000
    assert tok.eos_id == tok.vocab_size - 1


DETERMINISM_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from ats_tokenizer_inputs import stdlib_texts
from ats_tokenizer import Tokenizer
tok = Tokenizer.train(stdlib_texts(60), 4096, backend="python")
print(json.dumps([tok.sha256(), [list(m) for m in tok.merges]]))
"""


@pytest.mark.slow
def test_merges_identical_across_runs_and_processes():
    texts = stdlib_texts(60)
    first = Tokenizer.train(texts, 4096, backend="python")
    second = Tokenizer.train(texts, 4096, backend="python")
    assert len(first.merges) == 4096 - 257
    assert first.merges == second.merges and first.sha256() == second.sha256()
    script = DETERMINISM_SCRIPT.format(tests=str(Path(__file__).parent))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    sha, merges = json.loads(out)
    assert sha == first.sha256()
    assert [tuple(m) for m in merges] == list(first.merges)
    if HAS_NATIVE:
        native = Tokenizer.train(texts, 4096, backend="native")
        assert native.merges == first.merges


@needs_native
@settings(max_examples=150, deadline=None)
@given(counts=counts_strategy, n_merges=st.integers(0, 40), min_frequency=st.integers(1, 4))
def test_native_train_bpe_equals_reference(counts, n_merges, min_frequency):
    import ats_native

    expected = train_bpe(counts, n_merges, min_frequency)
    assert [tuple(m) for m in ats_native.train_bpe(counts, n_merges, min_frequency)] == expected


@needs_native
@pytest.mark.parametrize(
    "pattern,name", [(GPT4_PATTERN, "gpt4"), (GPT2_PATTERN, "gpt2")], ids=["gpt4", "gpt2"]
)
def test_native_word_counter_equals_reference(pattern, name, train_texts):
    import ats_native

    ours, native = WordCounter(pattern), ats_native.WordCounter(name)
    for i in range(0, len(train_texts), 7):
        ours.add(train_texts[i : i + 7])
        native.add(train_texts[i : i + 7], 2)
        ours.prune(3000)
        native.prune(3000)
    assert native.counts() == ours.counts() and len(native) == len(ours)
    assert [tuple(m) for m in native.train(500, 2)] == ours.train(500, 2)


@needs_native
@settings(max_examples=100, deadline=None)
@given(texts=st.lists(any_text, max_size=5))
def test_native_word_counter_on_arbitrary_unicode(texts):
    import ats_native

    ours, native = WordCounter(GPT4_PATTERN), ats_native.WordCounter("gpt4")
    ours.add(texts)
    native.add(texts, 0)
    assert native.counts() == ours.counts()
