"""Reference BPE encoding of one pre-token, checked against HF `tokenizers`' BPE model with an
arbitrary (non merge-order) id assignment, and the table's validation."""

import random

import pytest
from ats_tokenizer.bpe import BpeTable, bpe_encode, merge_pair
from ats_tokenizer.bytelevel import bytes_to_unicode_str
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models


def random_table(seed: int, n_merges: int) -> BpeTable:
    """Random merges over a small alphabet with shuffled ids (valid but not in merge order).

    Every merge makes a new string: HF's BPE vocab (like tiktoken's ranks) is keyed by the token's
    string, so a table where ("a", "aa") and ("aa", "a") both make a token "aaa" under two ids has
    no HF counterpart to compare with."""
    rng = random.Random(seed)
    ids = list(range(256 + n_merges))
    rng.shuffle(ids)
    byte_ids = ids[:256]
    known = [byte_ids[b] for b in b"abc "]
    spelled = {byte_ids[b]: bytes([b]) for b in b"abc "}
    strings = set(spelled.values())
    merges = []
    for i in range(n_merges):
        pair = (rng.choice(known), rng.choice(known))
        while spelled[pair[0]] + spelled[pair[1]] in strings:  # also rules out a repeated pair
            pair = (rng.choice(known), rng.choice(known))
        merged = ids[256 + i]
        spelled[merged] = spelled[pair[0]] + spelled[pair[1]]
        strings.add(spelled[merged])
        merges.append((*pair, merged))
        known.append(merged)
    return BpeTable(tuple(byte_ids), tuple(merges))


def hf_model(table: BpeTable) -> HFTokenizer:
    spell = {tid: bytes_to_unicode_str(b) for tid, b in table.token_bytes.items()}
    vocab = {s: tid for tid, s in spell.items()}
    merges = [(spell[left], spell[right]) for left, right, _ in table.merges]
    return HFTokenizer(models.BPE(vocab=vocab, merges=merges))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), word=st.text("abc ", max_size=24))
def test_matches_hf_bpe_with_shuffled_ids(seed, word):
    table = random_table(seed, 20)
    data = word.encode("utf-8")
    # No pre-tokenizer: the HF model sees the whole ByteLevel string as one word.
    expected = hf_model(table).encode(bytes_to_unicode_str(data)).ids if data else []
    assert bpe_encode(data, table) == expected


def test_lowest_rank_leftmost_first():
    a, b = ord("a"), ord("b")
    table = BpeTable(tuple(range(256)), ((a, a, 256), (256, a, 257), (b, a, 258)))
    assert bpe_encode(b"aaa", table) == [257]  # aa + a
    assert bpe_encode(b"aa", table) == [256]
    assert bpe_encode(b"baaa", table) == [b, 257]  # (a,a) rank 0 beats (b,a) rank 2
    assert merge_pair([a, a, a], (a, a), 256) == [256, a]


def test_table_validation():
    with pytest.raises(ValueError, match="256 ids"):
        BpeTable(tuple(range(255)), ())
    with pytest.raises(ValueError, match="not a byte id or the result of an earlier merge"):
        BpeTable(tuple(range(256)), ((300, 1, 256),))
    with pytest.raises(ValueError, match="already in use"):
        BpeTable(tuple(range(256)), ((1, 2, 3),))
    with pytest.raises(ValueError, match="appears twice"):
        BpeTable(tuple(range(256)), ((1, 2, 256), (1, 2, 257)))
