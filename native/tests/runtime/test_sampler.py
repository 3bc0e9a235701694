"""Sampling in C++: seeded draws are reproducible, top_k=1 and tiny top_p are greedy, and sampled
token frequencies follow softmax(logits / temperature) restricted by top-k / top-p."""

import ats_native
import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def native(saved_model) -> ats_native.Model:
    _, directory = saved_model("tiny-dense")
    return ats_native.Model(str(directory), threads=2)


def test_seed_reproducible_and_varies(native) -> None:
    a = list(native.generate([1, 2, 3], 20, temperature=1.0, seed=7))
    b = list(native.generate([1, 2, 3], 20, temperature=1.0, seed=7))
    c = list(native.generate([1, 2, 3], 20, temperature=1.0, seed=8))
    assert a == b and a != c


def test_top_k_one_and_small_top_p_are_greedy(native) -> None:
    greedy = list(native.generate([4, 5, 6], 15))
    assert list(native.generate([4, 5, 6], 15, temperature=0.9, top_k=1, seed=3)) == greedy
    assert list(native.generate([4, 5, 6], 15, temperature=0.9, top_p=1e-6, seed=3)) == greedy


def first_token_counts(native, n: int, **kw) -> np.ndarray:
    """Histogram of the first sampled token over n prompts-with-different-seeds batches."""
    out = native.generate_batch([[9, 8, 7]] * n, 1, seed=123, **kw)  # sequence b uses seed + b
    return np.bincount([o[0] for o in out], minlength=native.vocab_size)


def test_frequencies_follow_the_distribution(native) -> None:
    n = 4000
    logits = torch.from_numpy(native.logits([9, 8, 7])[-1].astype(np.float64))
    temperature, top_k, top_p = 0.5, 20, 0.9
    z = logits / temperature
    kth = torch.topk(z, top_k).values[-1]
    z = z.masked_fill(z < kth, float("-inf"))
    sorted_z, order = torch.sort(z, descending=True)
    p_sorted = torch.softmax(sorted_z, -1)
    drop = (p_sorted.cumsum(-1) - p_sorted) >= top_p
    z[order[drop]] = float("-inf")
    expected = torch.softmax(z, -1).numpy()
    counts = first_token_counts(native, n, temperature=temperature, top_k=top_k, top_p=top_p)
    assert counts[expected == 0].sum() == 0  # nothing outside the top-k / nucleus set
    freq = counts / n
    # every frequency within 4.5 binomial standard deviations of its probability
    sd = np.sqrt(expected * (1 - expected) / n)
    assert (np.abs(freq - expected) <= 4.5 * sd + 1e-3).all()


def test_seed_range_is_0_to_2_pow_64_minus_1(saved_model) -> None:
    """A seed is any int 0..2**64-1 (the generator's seed space); anything else is a ValueError
    naming it, not nanobind's TypeError."""
    _, directory = saved_model("tiny-dense")
    model = ats_native.Model(str(directory), threads=1)
    sample = {"temperature": 1.0}
    for seed in (-1, 2**64, 2**100, 1.5, "3", True):
        with pytest.raises(ValueError, match=r"seed = .*: expected an integer 0 to 2\*\*64 - 1"):
            model.generate([1, 2], 3, seed=seed, **sample)
        with pytest.raises(ValueError, match=r"seed = .*: expected an integer 0 to 2\*\*64 - 1"):
            model.generate_batch([[1, 2]], 3, seed=seed, **sample)
    top = list(model.generate([1, 2], 8, seed=2**64 - 1, **sample))
    assert top == list(model.generate([1, 2], 8, seed=2**64 - 1, **sample))
    # generate_batch's sequence b samples with seed + b modulo 2**64: the top seed's second
    # sequence is seed 0's
    batch = model.generate_batch([[1, 2], [1, 2]], 8, seed=2**64 - 1, **sample)
    assert batch == [top, list(model.generate([1, 2], 8, seed=0, **sample))]
