"""The train/val split depends on content only and hits val_fraction on average."""

import random

import pytest
from ats_data.dedup import document_digest
from ats_data.errors import DataError
from ats_data.split import assign_split, check_val_fraction


def test_split_is_by_content_and_near_the_fraction():
    docs = [f"document number {i}" for i in range(20000)]
    splits = {d: assign_split(document_digest(d), 0.1) for d in docs}
    shuffled = docs[:]
    random.Random(0).shuffle(shuffled)
    assert {d: assign_split(document_digest(d), 0.1) for d in shuffled} == splits
    n_val = sum(s == "val" for s in splits.values())
    # binomial(20000, 0.1): sd ~ 42; 6 sd bounds
    assert 2000 - 260 < n_val < 2000 + 260
    # the reference rule, written out
    for d in docs[:200]:
        frac = int.from_bytes(document_digest(d)[:8], "big") / 2**64
        assert splits[d] == ("val" if frac < 0.1 else "train")


def test_fraction_zero_and_bounds():
    assert {assign_split(document_digest(str(i)), 0.0) for i in range(1000)} == {"train"}
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(DataError, match="val_fraction must be in"):
            check_val_fraction(bad)
