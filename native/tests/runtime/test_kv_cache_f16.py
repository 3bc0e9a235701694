"""Model(kv_cache="f16") against its oracle: ats-model with every key and value rounded to half
precision (torch's float -> half cast, round to nearest even, as F16C and the scalar set do) before
attention. Prefill logits (runs of rows and single rows) and decode logprobs (each key and value
read back from the f16 cache by dot_f16 / vecmat_f16) on every kernel set, dense GQA, MoD (skipped
key slots), MoE and a head_dim with a tail past the vectors; the sets' half-precision conversions
against numpy's, bit for bit; the option's errors."""

import ats_native
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kernel_sets import kernel_params

REL_TOL = 1e-4  # test_parity.py's, for the f32 cache
# The f16 cache against its oracle: the runtime's fp32 keys and values differ from torch's in the
# last bits (summation order), so now and then one lies on the other side of a half-precision
# rounding midpoint and rounds one half-precision step (2^-11 relative) away from the oracle's:
# ~1e-4 of the logits' scale on these models, where rounding itself moves them ~1e-3 (the last
# test), so the bound still tells a correct f16 cache from an unrounded or wrongly rounded one.
F16_REL_TOL = 4e-4
LOGPROB_TOL = 2e-3  # absolute, on log-probabilities of magnitude ~1-10
# preset and config changes: GQA, MoD (skipped key slots), MoE; head_dim 20, which leaves a tail
# past the vectors of every set (AVX2 8 lanes, AVX-512 16)
MODELS = {
    "dense": ("tiny-dense", {}),
    "mod": ("tiny-mod", {}),
    "moe": ("tiny-moe", {}),
    "dense-hd20": ("tiny-dense", {"dim": 40, "n_head": 2, "n_kv_head": 1, "head_dim": 20}),
}


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def reference_logits(model: torch.nn.Module, ids: torch.Tensor, half_kv: bool) -> np.ndarray:
    """ats-model's logits, keys and values rounded to half precision when half_kv."""
    sdpa = F.scaled_dot_product_attention

    def rounded(q, k, v, **kw):
        return sdpa(q, k.half().float(), v.half().float(), **kw)

    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        if half_kv:
            mp.setattr(F, "scaled_dot_product_attention", rounded)
        return model(ids, causal_routing=True).logits.float().numpy()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.parametrize("kernels", kernel_params())
@pytest.mark.parametrize("name", sorted(MODELS))
def test_prefill_logits_match_half_precision_oracle(saved_model, name: str, kernels: str) -> None:
    preset, changes = MODELS[name]
    model, directory = saved_model(preset, **changes)
    native = ats_native.Model(str(directory), threads=2, kernels=kernels, kv_cache="f16")
    assert native.kv_cache == "f16"
    # 70 rows: a 64-row run and a 6-row run (keys gathered and converted); 3 rows: single rows
    for length in (70, 3):
        ids = torch.randint(
            0, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(4)
        )
        got = native.logits(ids.numpy())
        assert rel_err(got, reference_logits(model, ids, half_kv=True)) < F16_REL_TOL, length


@pytest.mark.parametrize("kernels", kernel_params())
@pytest.mark.parametrize("name", sorted(MODELS))
def test_decode_logprobs_match_half_precision_oracle(saved_model, name: str, kernels: str) -> None:
    """Two sequences decoding together (the decode path reads the f16 cache in place); each
    step's top-20 logprobs equal the oracle's full forward over the same tokens."""
    preset, changes = MODELS[name]
    model, directory = saved_model(preset, **changes)
    native = ats_native.Model(str(directory), threads=2, kernels=kernels, kv_cache="f16")
    prompts = [list(range(3, 12)), list(range(40, 53))]
    batch = ats_native.Batch(native, n_slots=2, max_len=64)
    for slot, prompt in enumerate(prompts):
        batch.start(slot, prompt, 20, logprobs=True, top_logprobs=20)
    steps: dict[int, list] = {0: [], 1: []}
    while batch.busy(0) or batch.busy(1):
        for slot, token, _, _, top in batch.step():
            steps[slot].append((token, top))
    for slot, prompt in enumerate(prompts):
        tokens = [token for token, _ in steps[slot]]
        ids = torch.tensor([prompt + tokens])
        ref = log_softmax(reference_logits(model, ids, half_kv=True)[0])
        for i, (_, top) in enumerate(steps[slot]):
            row = ref[len(prompt) - 1 + i]
            for token_id, logprob in top:
                assert abs(logprob - row[token_id]) < LOGPROB_TOL, (slot, i, token_id)
        assert len(set(tokens)) > 3, "degenerate model: the test would not see decoding errors"


def test_half_precision_changes_the_logits(saved_model) -> None:
    """The oracle tells the two caches apart: with f16 keys and values the logits move further
    from the unrounded model than the tolerance the tests above hold them to its oracle."""
    model, directory = saved_model("tiny-dense")
    ids = torch.randint(
        0, model.config.vocab_size, (2, 70), generator=torch.Generator().manual_seed(4)
    )
    f16 = ats_native.Model(str(directory), threads=2, kv_cache="f16").logits(ids.numpy())
    f32 = ats_native.Model(str(directory), threads=2).logits(ids.numpy())
    exact = reference_logits(model, ids, half_kv=False)
    assert rel_err(f32, exact) < REL_TOL
    assert rel_err(f16, exact) > 2 * F16_REL_TOL


def special_values() -> np.ndarray:
    """Values where half-precision rounding is easy to get wrong, each with both signs: exact
    ties between two halves (nearest even: down from an even code, up from an odd one), the
    subnormal range and its ties, the largest half, the midpoint to the next (65520: inf), zero,
    infinity, NaN; then random values over the whole exponent range."""
    ulp = 2.0**-10  # the half spacing in [1, 2)
    ties = [1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2.0**-20, 1 + ulp / 2 - 2.0**-20]
    subnormal = [2.0**-14, 2.0**-15, 2.0**-24, 2.0**-25, 3 * 2.0**-25, 2.0**-26, 1.5 * 2.0**-24]
    edges = [65504.0, 65519.99, 65520.0, 65536.0, 1e30, 0.0, np.inf, np.nan, 6.1e-5]
    fixed = np.array(ties + subnormal + edges, dtype=np.float32)
    rng = np.random.default_rng(0)
    random = (rng.standard_normal(4000) * 2.0 ** rng.integers(-30, 20, 4000)).astype(np.float32)
    return np.concatenate([fixed, -fixed, random])


@pytest.mark.parametrize("kernels", kernel_params())
@pytest.mark.parametrize("length", [1, 7, 19, 4061])  # tails past 8 and 16 lanes
def test_half_round_matches_numpy(kernels: str, length: int) -> None:
    """The cache's conversions equal numpy's float32 -> float16 -> float32 (IEEE, nearest even)
    bit for bit, NaN for NaN, on every kernel set."""
    x = special_values()[:length]
    got = ats_native.half_round(x, kernels=kernels)
    with np.errstate(over="ignore"):  # 65520 and past round to inf: the expected result
        want = x.astype(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_kv_cache_errors(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    with pytest.raises(ValueError, match="unknown kv_cache 'f8'"):
        ats_native.Model(str(directory), kv_cache="f8")
    with pytest.raises(ValueError, match="kv_cache 'f16' is for the CPU"):
        ats_native.Model(str(directory), device="cuda", kv_cache="f16")
    assert ats_native.Model(str(directory)).kv_cache == "f32"
    with pytest.raises(ValueError, match="kernels 'sse' is unknown"):
        ats_native.half_round(np.zeros(3, np.float32), kernels="sse")
