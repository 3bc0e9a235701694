"""Continuous batching (ats_native.Batch over include/ats/batch.h): requests that join, leave and
prefill in chunks while others decode give the tokens each gives alone; logprobs, logit bias and
penalties against a numpy oracle over the model's own logits; slot reuse and bad input."""

import fcntl
import os

import ats_native
import numpy as np
import pytest

FINISH_NONE, FINISH_STOP, FINISH_LENGTH = (
    ats_native.FINISH_NONE,
    ats_native.FINISH_STOP,
    ats_native.FINISH_LENGTH,
)


@pytest.fixture(scope="module")
def native(saved_model) -> ats_native.Model:
    _, directory = saved_model("tiny-dense")
    return ats_native.Model(str(directory), threads=2)


def run(batch: ats_native.Batch, budget: int = 0, steps: int = 10_000) -> dict[int, list]:
    """Steps until no slot is busy; events per slot in order."""
    out: dict[int, list] = {}
    for _ in range(steps):
        events = batch.step(budget)
        if not events:
            break
        for event in events:
            out.setdefault(event[0], []).append(event)
    return out


def tokens(events: list) -> list[int]:
    return [e[1] for e in events]


def test_staggered_chunked_requests_match_alone(native) -> None:
    prompts = [list(range(5, 40)), [9], [3, 7, 11, 200, 5], list(range(100, 160))]
    alone = [list(native.generate(p, 12)) for p in prompts]
    batch = ats_native.Batch(native, n_slots=3, max_len=128)
    got: dict[int, list[int]] = {}
    pending = list(enumerate(prompts))
    owner: dict[int, int] = {}  # slot -> request
    step = 0
    while pending or any(batch.busy(s) for s in range(3)):
        # one request joins every other step, in any free slot, while others decode
        if pending and step % 2 == 0:
            free = [s for s in range(3) if not batch.busy(s)]
            if free:
                request, prompt = pending.pop(0)
                batch.start(free[0], prompt, 12)
                owner[free[0]] = request
        for slot, token, finish, _, _ in batch.step(prefill_budget=7):
            got.setdefault(owner[slot], []).append(token)
            assert finish in (FINISH_NONE, FINISH_LENGTH)
        step += 1
    assert [got[i] for i in range(len(prompts))] == alone


def test_stop_token_and_length_free_the_slot(native) -> None:
    free_run = list(native.generate([1, 2, 3], 10))
    batch = ats_native.Batch(native, 1, 64)
    batch.start(0, [1, 2, 3], 10, stop_tokens=[free_run[4]])
    events = run(batch)[0]
    first = free_run.index(free_run[4])
    assert tokens(events) == free_run[: first + 1]
    assert [e[2] for e in events] == [FINISH_NONE] * first + [FINISH_STOP]
    assert not batch.busy(0)
    batch.start(0, [1, 2, 3], 4)  # the freed slot is reused from a clean cache
    events = run(batch)[0]
    assert tokens(events) == free_run[:4] and events[-1][2] == FINISH_LENGTH


def test_cache_full_ends_with_length(native) -> None:
    batch = ats_native.Batch(native, 1, 8)
    batch.start(0, [1, 2, 3, 4, 5], 100)
    events = run(batch)[0]
    assert len(events) == 4 and events[-1][2] == FINISH_LENGTH  # 5 + 3 fed = 8 slots
    assert tokens(events) == list(native.generate([1, 2, 3, 4, 5], 4))


def test_cancel_frees_and_others_continue(native) -> None:
    alone = list(native.generate([4, 5, 6], 8))
    batch = ats_native.Batch(native, 2, 64)
    batch.start(0, [7, 7, 7], 8)
    batch.start(1, [4, 5, 6], 8)
    first = batch.step()
    assert {e[0] for e in first} == {0, 1}
    batch.cancel(0)
    assert not batch.busy(0) and batch.busy(1)
    rest = run(batch)
    assert set(rest) == {1}
    assert [e[1] for e in first if e[0] == 1] + tokens(rest[1]) == alone


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - (np.log(np.exp(z - z.max()).sum()) + z.max())


def test_logprobs_match_log_softmax(native) -> None:
    prompt = [10, 20, 30, 40]
    batch = ats_native.Batch(native, 1, 64)
    batch.start(0, prompt, 5, logprobs=True, top_logprobs=3)
    events = run(batch)[0]
    out = tokens(events)
    full = native.logits(prompt + out)[len(prompt) - 1 : -1]  # (5, V)
    for row, (_, token, _, logprob, top) in zip(full, events, strict=True):
        ref = log_softmax(row)
        assert logprob == pytest.approx(ref[token], abs=1e-4)
        order = np.argsort(-ref, kind="stable")[:3]
        assert [t for t, _ in top] == order.tolist()
        assert [lp for _, lp in top] == pytest.approx(ref[order].tolist(), abs=1e-4)


def test_greedy_ids_are_the_first_argmax_of_the_logits(native) -> None:
    # greedy steps without logprobs take the ids from the forward pass (on the GPU only those come
    # back); with logprobs the sampler reads the logits: both are np.argmax's (first-max) choice
    prompt = [10, 20, 30, 40]
    got = {}
    for logprobs in (False, True):
        batch = ats_native.Batch(native, 1, 64)
        batch.start(0, prompt, 6, logprobs=logprobs)
        got[logprobs] = tokens(run(batch)[0])
    full = native.logits(prompt + got[False])[len(prompt) - 1 : -1]  # (6, V)
    assert got[False] == got[True] == np.argmax(full, axis=-1).tolist()


def test_penalties_and_bias_match_oracle(native) -> None:
    prompt = [1, 2, 3]
    presence, frequency, bias = 0.7, 1.3, {17: 2.5, 30: -100.0}
    batch = ats_native.Batch(native, 1, 64)
    batch.start(
        0, prompt, 16, presence_penalty=presence, frequency_penalty=frequency, logit_bias=bias
    )
    got = tokens(run(batch)[0])
    # oracle: greedy over logits + bias - presence * seen - frequency * count
    out: list[int] = []
    for _ in range(16):
        z = native.logits(prompt + out)[-1].astype(np.float64)
        for token, b in bias.items():
            z[token] += b
        counts = np.bincount(np.array(out, dtype=np.int64), minlength=len(z))
        z -= presence * (counts > 0) + frequency * counts
        out.append(int(np.argmax(z)))
    assert got == out
    assert got != list(native.generate(prompt, 16))  # the penalties changed something


def test_bad_input_is_refused(native) -> None:
    batch = ats_native.Batch(native, 2, 16)
    batch.start(0, [1, 2], 3)
    with pytest.raises(ValueError, match="slot 0 is busy"):
        batch.start(0, [1, 2], 3)
    with pytest.raises(ValueError, match=r"slot 2 is out of range \[0, 2\)"):
        batch.start(2, [1, 2], 3)
    with pytest.raises(ValueError, match="leaves no room"):
        batch.start(1, list(range(16)), 3)
    with pytest.raises(ValueError, match=r"logit_bias token id 9999 is out of range"):
        batch.start(1, [1], 3, logit_bias={9999: 1.0})
    with pytest.raises(ValueError, match="logit_bias of token id 3 is not a finite number"):
        batch.start(1, [1], 3, logit_bias={3: float("nan")})
    with pytest.raises(ValueError, match="top_logprobs"):
        batch.start(1, [1], 3, logprobs=True, top_logprobs=21)
    with pytest.raises(ValueError, match="max_new_tokens >= 1"):
        batch.start(1, [1], 0)
    with pytest.raises(ValueError, match="frequency_penalty"):
        batch.start(1, [1], 3, frequency_penalty=float("inf"))
    with pytest.raises(ValueError, match="prefill_budget"):
        batch.step(-1)
    assert not batch.busy(1)  # nothing refused took the slot
    assert tokens(run(batch)[0]) == list(native.generate([1, 2], 3))
    with pytest.raises(ValueError, match="n_seq >= 1"):
        ats_native.Batch(native, 0, 16)


def test_step_wakes_each_fd_first(native) -> None:
    """wake_fds: one byte per fd, then the step; a full pipe is a pending wake-up, not an error;
    an fd that cannot be written refuses the step (its tokens come at the next one)."""
    batch = ats_native.Batch(native, n_slots=1, max_len=64)
    batch.start(0, [5, 6, 7], 3)
    (r1, w1), (r2, w2) = os.pipe(), os.pipe()
    try:
        for fd in (r1, w1, r2, w2):
            os.set_blocking(fd, False)
        first = batch.step(0, [w1, w2])
        assert os.read(r1, 16) == b"\0" and os.read(r2, 16) == b"\0"
        fcntl.fcntl(w1, fcntl.F_SETPIPE_SZ, 4096)
        with pytest.raises(BlockingIOError):
            while True:
                os.write(w1, b"x" * 4096)  # fill the pipe
        second = batch.step(0, [w1])  # full: counts as woken
        r3, w3 = os.pipe()
        os.close(r3)
        os.close(w3)
        with pytest.raises(ValueError, match=f"wake_fds: cannot write to fd {w3}"):
            batch.step(0, [w3])
        assert batch.busy(0)
        third = batch.step(0)
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)
    assert [e[1] for e in first + second + third] == list(native.generate([5, 6, 7], 3))
    assert third[0][2] == FINISH_LENGTH
