"""vocab_limit of the engines' batches (ats_native.Batch.start, the torch engine's TorchBatch.start):
on a model whose padding rows (ids past the tokenizer's 512) win the argmax, a request limited to
512 ids never draws one, greedy or sampled, alongside an unlimited request in the same batch; its
greedy ids are the first argmax of the logits' first 512 entries and its logprobs a log-softmax
over those; the native and torch engines give the same tokens and logprobs."""

import dataclasses

import ats_native
import numpy as np
import pytest
import torch
from ats_infer.engine import load_engine
from ats_model import build_model, presets, save_pretrained

LIMIT = 512  # the tokenizer's ids (conftest.VOCAB); the model has 1024 rows
PROMPT = [10, 20, 30, 40, 50]
N = 24


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory, tokenizer_json):
    torch.manual_seed(0)
    config = dataclasses.replace(presets.get("tiny-dense"), vocab_size=1024, init_std=0.2,
                                 tie_embeddings=False)  # fmt: skip
    model = build_model(config)
    with torch.no_grad():
        model.output.weight[LIMIT:] *= 4  # the padding rows' logits dominate
    out = tmp_path_factory.mktemp("padded")
    return save_pretrained(model, out, tokenizer_json=tokenizer_json)


@pytest.fixture(scope="module")
def native(padded_dir) -> ats_native.Model:
    return ats_native.Model(str(padded_dir), threads=1)


def run(batch, steps: int = 10_000) -> dict[int, list]:
    out: dict[int, list] = {}
    for _ in range(steps):
        events = batch.step(0)
        if not events:
            break
        for event in events:
            out.setdefault(event[0], []).append(event)
    return out


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - (np.log(np.exp(z - z.max()).sum()) + z.max())


def test_padding_rows_win_without_the_limit(native) -> None:
    tokens = list(native.generate(PROMPT, N))
    assert sum(t >= LIMIT for t in tokens) > N // 2, tokens  # the premise of the tests below


def test_greedy_within_the_limit_beside_an_unlimited_request(native) -> None:
    batch = ats_native.Batch(native, 2, 64)
    batch.start(0, PROMPT, N, vocab_limit=LIMIT)
    batch.start(1, PROMPT, N)  # greedy over the whole vocabulary in the same steps
    events = run(batch)
    limited = [e[1] for e in events[0]]
    assert [e[1] for e in events[1]] == list(native.generate(PROMPT, N))
    assert max(limited) < LIMIT
    full = native.logits(PROMPT + limited)[len(PROMPT) - 1 : -1]  # (N, 1024)
    assert limited == np.argmax(full[:, :LIMIT], axis=-1).tolist()


def test_logprobs_and_sampling_within_the_limit(native) -> None:
    batch = ats_native.Batch(native, 1, 64)
    batch.start(0, PROMPT, N, vocab_limit=LIMIT, logprobs=True, top_logprobs=5)
    events = run(batch)[0]
    got = [e[1] for e in events]
    full = native.logits(PROMPT + got)[len(PROMPT) - 1 : -1]
    for row, (_, token, _, logprob, top) in zip(full, events, strict=True):
        ref = log_softmax(row[:LIMIT])
        assert token == int(np.argmax(row[:LIMIT]))
        assert logprob == pytest.approx(ref[token], abs=1e-4)
        order = np.argsort(-ref, kind="stable")[:5]
        assert [t for t, _ in top] == order.tolist()
        assert [lp for _, lp in top] == pytest.approx(ref[order].tolist(), abs=1e-4)
    batch = ats_native.Batch(native, 4, 128)
    for slot in range(4):
        batch.start(slot, PROMPT, 100, temperature=1.5, seed=slot, vocab_limit=LIMIT,
                    logit_bias={7: 1.0})  # fmt: skip
    sampled = [e[1] for events in run(batch).values() for e in events]
    assert len(sampled) == 400 and max(sampled) < LIMIT and len(set(sampled)) > 50


def test_native_and_torch_engines_agree(padded_dir, native) -> None:
    torch_engine = load_engine(padded_dir, "torch", device="cpu", threads=1)
    got = {}
    for name, batch in (("native", ats_native.Batch(native, 2, 64)),
                        ("torch", torch_engine.batch(2))):  # fmt: skip
        batch.start(0, PROMPT, N, vocab_limit=LIMIT, logprobs=True, top_logprobs=3)
        batch.start(1, [3, 1, 4, 1, 5], N, vocab_limit=LIMIT)
        got[name] = run(batch)
    for slot in (0, 1):
        native_tokens = [e[1] for e in got["native"][slot]]
        assert native_tokens == [e[1] for e in got["torch"][slot]]
        assert max(native_tokens) < LIMIT
    for a, b in zip(got["native"][0], got["torch"][0], strict=True):
        assert a[3] == pytest.approx(b[3], abs=1e-3)
        assert [t for t, _ in a[4]] == [t for t, _ in b[4]]


@pytest.mark.parametrize("engine", ["native", "torch"])
def test_bad_limits_are_refused(padded_dir, native, engine) -> None:
    batch = (ats_native.Batch(native, 1, 16) if engine == "native"
             else load_engine(padded_dir, "torch", device="cpu", threads=1).batch(1))  # fmt: skip
    for bad in (-1, 1025):
        with pytest.raises(ValueError, match=f"vocab_limit {bad} is out of range"):
            batch.start(0, [1, 2], 3, vocab_limit=bad)
    with pytest.raises(
        ValueError, match=rf"logit_bias token id 600 is out of range \[0, {LIMIT}\)"
    ):
        batch.start(0, [1, 2], 3, vocab_limit=LIMIT, logit_bias={600: 1.0})
    assert not batch.busy(0)
    batch.start(0, [1, 2], 3, vocab_limit=1024)  # the whole vocabulary, as 0
