"""ats_native.train_bpe vs a from-scratch plain-Python trainer written from the contract and vs the
reference ats_tokenizer.train.train_bpe; determinism across processes; input checks."""

import subprocess
import sys
import sysconfig
from pathlib import Path

import ats_native
import pytest
from ats_tokenizer.train import train_bpe as ref_train_bpe
from hypothesis import given, settings
from hypothesis import strategies as st


def naive_train(counts: dict[bytes, int], n_merges: int, min_frequency: int):
    """Recount every pair at every step (the contract, with no incremental bookkeeping)."""
    words = [(list(w), c) for w, c in counts.items() if c > 0]
    merges = []
    while len(merges) < n_merges:
        totals: dict[tuple[int, int], int] = {}
        for ids, c in words:
            for pair in zip(ids, ids[1:], strict=False):
                totals[pair] = totals.get(pair, 0) + c
        if not totals:
            break
        best = min(totals, key=lambda p: (-totals[p], p))
        if totals[best] < min_frequency:
            break
        new_id = 256 + len(merges)
        merges.append(best)
        for k, (ids, c) in enumerate(words):
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            words[k] = (out, c)
    return merges


small_counts = st.dictionaries(
    st.binary(max_size=12).map(lambda b: bytes(x % 4 + 97 for x in b)),  # few symbols: many ties
    st.integers(0, 20),
    max_size=12,
)
byte_counts = st.dictionaries(st.binary(max_size=16), st.integers(1, 1000), max_size=20)


@settings(max_examples=300, deadline=None)
@given(
    counts=st.one_of(small_counts, byte_counts),
    n_merges=st.integers(0, 40),
    min_frequency=st.integers(0, 5),
)
def test_matches_naive_and_reference_trainers(counts, n_merges, min_frequency) -> None:
    merges = ats_native.train_bpe(counts, n_merges, min_frequency)
    assert merges == naive_train(counts, n_merges, min_frequency)
    assert merges == ref_train_bpe(counts, n_merges, min_frequency)


def test_overlapping_pairs_count_every_position() -> None:
    # "aaaa" holds (a, a) three times; merging gives [aa, aa], then (aa, aa)
    assert ats_native.train_bpe({b"aaaa": 1}, 5, 1) == [(97, 97), (256, 256)]
    assert ats_native.train_bpe({b"aaa": 3}, 5, 1) == [(97, 97), (256, 97)]


def stdlib_texts(n_files: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return [p.read_text("utf-8", errors="replace") for p in files[:n_files]]


def test_matches_reference_on_stdlib_counts() -> None:
    counter = ats_native.WordCounter("gpt4")
    counter.add(stdlib_texts(40))
    counts = counter.counts()
    assert counter.train(500, 2) == ref_train_bpe(counts, 500, 2)


TRAIN_SCRIPT = """
import sys, sysconfig
from pathlib import Path
import ats_native
root = Path(sysconfig.get_paths()["stdlib"])
files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)[:60]
counter = ats_native.WordCounter("gpt4")
counter.add([p.read_text("utf-8", errors="replace") for p in files], threads=int(sys.argv[1]))
print(counter.train(2000, 2))
"""


def test_deterministic_across_processes() -> None:
    runs = []
    for threads, seed in ((1, "1"), (2, "2")):
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(
            [sys.executable, "-c", TRAIN_SCRIPT, str(threads)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(proc.stdout)
    assert runs[0] == runs[1]
    assert len(eval(runs[0])) == 2000  # noqa: S307 - our own printed list of tuples


@pytest.mark.parametrize(
    ("counts", "n_merges", "error", "message"),
    [
        ({"ab": 1}, 1, TypeError, "keys must be bytes, got str"),
        ({b"ab": -1}, 1, ValueError, r"counts\[b'ab'\] = -1"),
        ({b"ab": 2**63}, 1, ValueError, "counts must be ints"),
        ({b"ab": 1.5}, 1, ValueError, "counts must be ints"),
        ({b"ab": 1}, -1, ValueError, "n_merges must be >= 0, got -1"),
    ],
)
def test_bad_counts_raise(counts, n_merges, error, message) -> None:
    with pytest.raises(error, match=message):
        ats_native.train_bpe(counts, n_merges, 1)
