"""MinHash LSH near-duplicate removal on a synthetic corpus with planted pairs of known Jaccard
similarity (of the word 5-gram shingle sets, checked exactly with `shingles`): recall >= 0.9 for
pairs at J >= 0.8, and at most 1% of pairs below J = 0.5 removed."""

import random
import re

import numpy as np
import pytest
from ats_data.dedup import Dedup
from ats_data.document import Document
from ats_data.errors import DataError
from ats_data.minhash import (
    MinHashConfig,
    MinHashDeduper,
    shingles,
    signature,
    signature_reference,
    signatures_of_texts,
)
from hypothesis import given
from hypothesis import strategies as st

SHINGLES_PER_DOC = 200  # a document of 204 words has 200 five-word shingles


def _words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=8)) for _ in range(n)]


def _variant(rng: random.Random, words: list[str], jaccard: float) -> list[str]:
    """Keep a prefix, replace the tail with fresh words: the prefix's c shingles are shared and
    each side has s = n - 4, so J = c / (2s - c), i.e. c = 2sJ / (1 + J)."""
    s = len(words) - 4
    shared = round(2 * s * jaccard / (1 + jaccard))
    keep = shared + 4
    return words[:keep] + _words(rng, len(words) - keep)


def exact_jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a, 5), shingles(b, 5)
    return len(sa & sb) / len(sa | sb)


def planted_corpus(seed: int = 0):
    """(documents, pairs): each pair is (index of original, index of variant, exact Jaccard)."""
    rng = random.Random(seed)
    docs, pairs = [], []
    for target in [0.8, 0.85, 0.9, 0.95] * 50 + [0.3, 0.4, 0.45, 0.49] * 50:
        base = _words(rng, SHINGLES_PER_DOC + 4)
        docs.append(" ".join(base))
        docs.append(" ".join(_variant(rng, base, target)))
        pairs.append((len(docs) - 2, len(docs) - 1, exact_jaccard(docs[-2], docs[-1])))
    order = list(range(len(docs)))  # originals always come first: the variant is the one removed
    return docs, pairs, order


def test_planted_jaccard_is_exact():
    _, pairs, _ = planted_corpus()
    assert min(j for _, _, j in pairs[:200]) >= 0.8
    assert max(j for _, _, j in pairs[200:]) < 0.5
    assert abs(pairs[0][2] - 0.8) < 0.005


def test_recall_and_false_positives():
    docs, pairs, _ = planted_corpus()
    dedup = Dedup("minhash")
    kept = {
        d.id for d in dedup(Document(text=t, source="test", id=str(i)) for i, t in enumerate(docs))
    }
    high = [(a, b) for a, b, j in pairs if j >= 0.8]
    low = [(a, b) for a, b, j in pairs if j < 0.5]
    assert all(str(a) in kept for a, _ in high + low)  # the first of a cluster stays
    recall = sum(str(b) not in kept for _, b in high) / len(high)
    false_pos = sum(str(b) not in kept for _, b in low) / len(low)
    assert recall >= 0.9, recall
    assert false_pos <= 0.01, false_pos
    report = dedup.minhash.to_json()
    assert report["documents"] == len(docs)
    assert report["removed"] == len(docs) - len(kept)
    assert report["clusters"] == report["removed"]  # every cluster here is one pair
    assert report["largest_cluster"] == 2


def test_same_text_is_a_duplicate_and_defaults_are_finewebs():
    config = MinHashConfig()
    assert (config.ngram, config.bands, config.rows, config.num_perm) == (5, 14, 8, 112)
    dedup = MinHashDeduper(config)
    assert dedup.add(signature("one two three four five six seven", config))
    assert not dedup.add(signature("One two, three four five six seven!", config))  # normalised
    assert dedup.add(signature("an entirely different short text here", config))


def test_bad_settings():
    with pytest.raises(DataError, match="minhash threshold must be in"):
        MinHashConfig(threshold=1.5)
    with pytest.raises(DataError, match="dedup must be one of exact, minhash, none"):
        Dedup("fuzzy")


@pytest.mark.slow
def test_worker_processes_keep_the_same_documents():
    docs, _, _ = planted_corpus()
    docs = docs[:300] + docs[-300:]
    kept = {}
    for workers in (1, 2):
        stream = (Document(text=t, source="test", id=str(i)) for i, t in enumerate(docs))
        kept[workers] = [d.id for d in Dedup("minhash", workers=workers)(stream)]
    assert kept[1] == kept[2]
    assert len(kept[1]) < len(docs)


def test_signature_matches_the_plain_python_reference():
    config = MinHashConfig()
    rng = random.Random(3)
    texts = [
        "",
        "too short",
        "Ünïcödé wörds, ça va: naïve café au lait — déjà vu",
        " ".join(_words(rng, 60)),
        " ".join(_words(rng, 9)),
    ]
    want = np.stack([signature_reference(t, config) for t in texts])
    # block=7: documents span blocks and blocks hold several documents
    for block in (7, 4096):
        got = signatures_of_texts(texts, config, block=block)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(signature(texts[3], config), want[3])


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_ascii_words_split_as_the_unicode_rule(text):
    # \W and _ to spaces, then split: what the regex path does for non-ASCII text
    words = [w.encode() for w in re.sub(r"\W|_", " ", text.lower()).split()]
    assert shingles(text, 2) == (
        {b" ".join(words)}
        if len(words) <= 2
        else {b" ".join(words[i : i + 2]) for i in range(len(words) - 1)}
    )


def test_jaccard_estimate_is_unbiased_with_binomial_error():
    """On random documents with exact shingle Jaccard J spread over (0, 1), the fraction of equal
    signature values is Binomial(112, J) / 112: z = (estimate - J) / sqrt(J (1 - J) / 112) has
    mean 0 and variance 1 over the pairs (seeded, so the bounds below are fixed outcomes at
    about 4 standard errors)."""
    config = MinHashConfig()
    rng = random.Random(7)
    zs = []
    for i in range(300):
        base = _words(rng, SHINGLES_PER_DOC + 4)
        a, b = " ".join(base), " ".join(_variant(rng, base, 0.05 + 0.9 * i / 300))
        j = exact_jaccard(a, b)
        est = float(np.mean(signature(a, config) == signature(b, config)))
        zs.append((est - j) / np.sqrt(j * (1 - j) / config.num_perm))
    zs = np.array(zs)
    assert abs(zs.mean()) < 4 / np.sqrt(len(zs)), zs.mean()
    assert 0.65 < zs.var() < 1.35, zs.var()
    assert np.abs(zs).max() < 4.5
