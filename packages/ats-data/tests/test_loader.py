"""TokenLoader: windows are real slices of the shards, packed epochs cover every window once
across ranks, order is seeded, the global batch does not depend on the rank split, and resume is
exact mid-epoch and across epoch boundaries; split_windows covers a split once, over ranks."""

import json

import numpy as np
import pytest
import torch
from ats_data.dataset import ShardDataset
from ats_data.errors import DataError
from ats_data.loader import TokenLoader, split_windows

EOS = 65535
SHARD_LENGTHS = (1000, 333, 612)  # tokens per shard, one document each


@pytest.fixture
def dataset(tmp_path, make_token_dataset):
    # token value = global position, so a window is identified by its first token
    docs, pos = [], 0
    for n in SHARD_LENGTHS:
        doc = np.arange(pos, pos + n, dtype=np.int64)
        doc[-1] = EOS
        docs.append(doc)
        pos += n
    # shard_tokens 700: no two documents fit in one shard, so one document per shard
    make_token_dataset(tmp_path, {"train": docs}, vocab_size=65536, eos_id=EOS, shard_tokens=700)
    ds = ShardDataset(tmp_path)
    assert [len(m) for m in ds.shards("train")] == list(SHARD_LENGTHS)
    return ds


def reference_packed_starts(T: int) -> set[int]:
    starts, offset = set(), 0
    for n in SHARD_LENGTHS:
        starts |= {offset + k * T for k in range((n - 1) // T)}
        offset += n
    return starts


def check_windows(x: torch.Tensor, y: torch.Tensor, ds: ShardDataset, T: int) -> None:
    tokens = np.concatenate([np.asarray(m) for m in ds.shards("train")]).astype(np.int64)
    assert x.dtype == torch.int64 and y.dtype == torch.int64
    assert x.shape == y.shape == (x.shape[0], T)
    for row_x, row_y in zip(x.numpy(), y.numpy(), strict=True):
        start = int(row_x[0])
        np.testing.assert_array_equal(row_x, tokens[start : start + T])
        np.testing.assert_array_equal(row_y, tokens[start + 1 : start + T + 1])
        shard_end = np.cumsum(SHARD_LENGTHS)
        assert np.searchsorted(shard_end, start, "right") == np.searchsorted(
            shard_end, start + T, "right"
        )  # start and last target token lie in the same shard


def take(loader: TokenLoader, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [next(loader) for _ in range(n)]


@pytest.mark.parametrize("mode", ["packed", "random"])
def test_windows_are_shard_slices_and_y_is_x_shifted(dataset, mode):
    loader = TokenLoader(dataset, "train", 4, 16, seed=0, mode=mode)
    for x, y in take(loader, 10):
        check_windows(x, y, dataset, 16)
        if mode == "packed":
            assert set(x[:, 0].tolist()) <= reference_packed_starts(16)


# T=16: 120 windows, none left over at G=6; T=9: 214 windows, none left over at G=2;
# T=7: 276 windows, 4 left over at G=8
@pytest.mark.parametrize("T,B", [(16, 3), (9, 1), (7, 4)])
def test_packed_ranks_disjoint_and_cover_each_window_once(dataset, T, B):
    windows = reference_packed_starts(T)
    loaders = [
        TokenLoader(dataset, "train", B, T, seed=5, rank=r, world_size=2, mode="packed")
        for r in range(2)
    ]
    steps = loaders[0].steps_per_epoch
    assert steps == len(windows) // (2 * B)
    for epoch in range(2):
        seen = [[s for x, _ in take(ld, steps) for s in x[:, 0].tolist()] for ld in loaders]
        assert not set(seen[0]) & set(seen[1])
        union = seen[0] + seen[1]
        assert len(union) == len(set(union)) == steps * 2 * B  # no window twice in an epoch
        assert set(union) <= windows
        assert len(windows) - len(union) == len(windows) % (2 * B)  # only the remainder left
        assert all(ld.epoch == epoch + 1 and ld.step == 0 for ld in loaders)


def test_packed_exact_cover_when_divisible(tmp_path, make_token_dataset):
    doc = np.arange(8 * 10 + 1, dtype=np.int64)  # (81 - 1) // 8 = 10 windows of T = 8
    doc[-1] = EOS
    make_token_dataset(tmp_path, {"train": [doc]}, vocab_size=65536, eos_id=EOS)
    ds = ShardDataset(tmp_path)
    loaders = [
        TokenLoader(ds, "train", 5, 8, seed=1, rank=r, world_size=2, mode="packed") for r in (0, 1)
    ]
    assert loaders[0].steps_per_epoch == 1
    union = [s for ld in loaders for s in next(ld)[0][:, 0].tolist()]
    assert sorted(union) == [8 * k for k in range(10)]


@pytest.mark.parametrize("mode", ["packed", "random"])
def test_global_batch_is_independent_of_the_rank_split(dataset, mode):
    single = TokenLoader(dataset, "train", 6, 12, seed=3, mode=mode)
    ranks = [
        TokenLoader(dataset, "train", 3, 12, seed=3, rank=r, world_size=2, mode=mode)
        for r in (0, 1)
    ]
    for _ in range(single.steps_per_epoch + 3):  # crosses an epoch boundary
        x, y = next(single)
        parts = [next(ld) for ld in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts]))
        assert torch.equal(y, torch.cat([p[1] for p in parts]))


@pytest.mark.parametrize("mode", ["packed", "random"])
def test_deterministic_for_a_seed_and_reshuffled_per_epoch(dataset, mode):
    a = take(TokenLoader(dataset, "train", 4, 16, seed=11, mode=mode), 60)
    b = take(TokenLoader(dataset, "train", 4, 16, seed=11, mode=mode), 60)
    c = take(TokenLoader(dataset, "train", 4, 16, seed=12, mode=mode), 60)
    assert all(
        torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b, strict=True)
    )
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, c, strict=True))
    steps = TokenLoader(dataset, "train", 4, 16, seed=11, mode=mode).steps_per_epoch
    first = torch.cat([x for x, _ in a[:steps]])[:, 0]
    second = torch.cat([x for x, _ in a[steps : 2 * steps]])[:, 0]
    assert not torch.equal(first, second)
    if mode == "packed":
        assert sorted(first.tolist()) != first.tolist()  # shuffled
        assert len(set(first.tolist())) == len(first)


@pytest.mark.parametrize("mode", ["packed", "random"])
@pytest.mark.parametrize("stop", ["mid_epoch", "epoch_end", "before_boundary"])
def test_exact_resume(dataset, mode, stop):
    kw = dict(seed=7, rank=1, world_size=2, mode=mode)
    reference = TokenLoader(dataset, "train", 3, 16, **kw)
    steps = reference.steps_per_epoch
    k = {"mid_epoch": steps + steps // 2, "epoch_end": steps, "before_boundary": 2 * steps - 2}[
        stop
    ]
    take(reference, k)
    state = json.loads(json.dumps(reference.state_dict()))  # survives a JSON checkpoint
    expected = take(reference, 8)
    resumed = TokenLoader(dataset, "train", 3, 16, **kw)
    resumed.load_state_dict(state)
    got = take(resumed, 8)
    for (ex, ey), (gx, gy) in zip(expected, got, strict=True):
        assert torch.equal(ex, gx) and torch.equal(ey, gy)


def test_resume_on_another_world_size_with_the_same_global_batch(dataset):
    one = TokenLoader(dataset, "train", 4, 16, seed=2, mode="packed")
    take(one, 5)
    state = one.state_dict()
    two = [
        TokenLoader(dataset, "train", 2, 16, seed=2, rank=r, world_size=2, mode="packed")
        for r in (0, 1)
    ]
    for ld in two:
        ld.load_state_dict(state)
    for _ in range(10):
        x, _ = next(one)
        assert torch.equal(x, torch.cat([next(ld)[0] for ld in two]))


def test_bad_arguments_and_mismatched_state(dataset):
    with pytest.raises(DataError, match="mode must be one of random, packed, got 'linear'"):
        TokenLoader(dataset, "train", 2, 8, seed=0, mode="linear")
    with pytest.raises(DataError, match="need 0 <= rank < world_size"):
        TokenLoader(dataset, "train", 2, 8, seed=0, rank=2, world_size=2)
    with pytest.raises(DataError, match="fewer than one global batch"):
        TokenLoader(dataset, "train", 64, 64, seed=0)
    with pytest.raises(DataError, match="split 'val' not in dataset"):
        TokenLoader(dataset, "val", 2, 8, seed=0)
    state = TokenLoader(dataset, "train", 2, 8, seed=0).state_dict()
    with pytest.raises(DataError, match="seed is 0 in the state, 1 here"):
        TokenLoader(dataset, "train", 2, 8, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="global_batch is 2 in the state, 4 here"):
        TokenLoader(dataset, "train", 4, 8, seed=0).load_state_dict(state)
    with pytest.raises(DataError, match="out of range"):
        TokenLoader(dataset, "train", 2, 8, seed=0).load_state_dict({**state, "step": 10**6})


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_split_windows_yield_every_packed_window_once_over_the_ranks(dataset, world_size):
    T, B = 50, 7
    starts = []
    for rank in range(world_size):
        batches = list(split_windows(dataset, "train", T, B, rank=rank, world_size=world_size))
        assert all(len(x) <= B for x, _ in batches)
        for x, y in batches:
            check_windows(x, y, dataset, T)
            starts += x[:, 0].tolist()
    every = sorted(reference_packed_starts(T))  # 37 windows
    # shard order, no window twice; equal shares leave out the last 37 % world_size windows
    assert starts == every[: len(every) // world_size * world_size]


def test_split_windows_bad_arguments_and_a_split_too_short_name_them(dataset):
    with pytest.raises(DataError, match="need 0 <= rank < world_size, got rank 2, world_size 2"):
        next(split_windows(dataset, "train", 50, 4, rank=2, world_size=2))
    with pytest.raises(DataError, match="batch_size and seq_len must be >= 1, got 0, 50"):
        next(split_windows(dataset, "train", 50, 0))
    with pytest.raises(DataError, match="split 'train' .* has no window of 1001 tokens"):
        next(split_windows(dataset, "train", 1000, 4))
    with pytest.raises(DataError, match="has 2 windows of 501 tokens, fewer than the 3 ranks"):
        next(split_windows(dataset, "train", 500, 4, rank=0, world_size=3))
