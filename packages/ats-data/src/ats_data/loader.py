"""`TokenLoader`: batches of (x, y) int64 torch tensors, shape (batch_size, seq_len), from one
split of a ShardDataset, with y = x shifted by one token. Windows never cross shards.

  mode="packed": consecutive windows  [k*T, k*T + T + 1) of every shard (x windows do not
                 overlap), visited in a seeded shuffled order.
  mode="random": window starts drawn uniformly over every valid position of every shard.

Each epoch has steps_per_epoch = num_windows // (world_size * batch_size) global batches and an
order drawn from a generator seeded with (seed, epoch). Global batch s is order[s*G : (s+1)*G]
(G = world_size * batch_size) and rank r takes its r-th contiguous slice of batch_size windows, so
ranks are disjoint, and the union over ranks of a step does not depend on how the global batch
is split between ranks and micro-batches. The state is (epoch, step): it is the same on every
rank and resumes exactly, also on another world size with the same global batch.
"""

from collections.abc import Iterator

import numpy as np
import torch

from ats_data.dataset import ShardDataset
from ats_data.errors import DataError

MODES = ("random", "packed")
STATE_VERSION = 1
# state fields that must match for a resume to continue the same data order
_IDENTITY_KEYS = (
    "version",
    "mode",
    "seed",
    "split",
    "seq_len",
    "global_batch",
    "num_windows",
    "tokenizer_sha256",
)


class TokenLoader:
    """An endless iterator of (x, y) batches; see the module docstring for the order."""

    def __init__(
        self,
        dataset: ShardDataset,
        split: str,
        batch_size: int,
        seq_len: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        mode: str = "random",
    ) -> None:
        if mode not in MODES:
            raise DataError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        _check_geometry(batch_size, seq_len, rank, world_size)
        self.dataset = dataset
        self.split = split
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.mode = mode
        self._shards = dataset.shards(split)
        packed_counts = _packed_counts(self._shards, seq_len)
        self.num_windows = int(packed_counts.sum())
        lengths = np.array([len(m) for m in self._shards], dtype=np.int64)
        counts = packed_counts if mode == "packed" else np.maximum(lengths - seq_len, 0)
        self._cum = np.concatenate([[0], np.cumsum(counts)])  # global id -> shard boundaries
        self.global_batch = world_size * batch_size
        self.steps_per_epoch = self.num_windows // self.global_batch
        if self.steps_per_epoch == 0:
            raise DataError(
                f"split {split!r} of {dataset.path} has {self.num_windows} windows of "
                f"{seq_len + 1} tokens, fewer than one global batch of {self.global_batch} "
                f"(world_size {world_size} x batch_size {batch_size})"
            )
        self.epoch = 0
        self.step = 0
        self._order: np.ndarray | None = None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        # A fresh generator per epoch, seeded from (seed, epoch): any epoch's order can be
        # rebuilt on resume without replaying the ones before it.
        rng = np.random.default_rng([self.seed, epoch])
        n = self.steps_per_epoch * self.global_batch
        if self.mode == "packed":
            return rng.permutation(self.num_windows)[:n]
        return rng.integers(0, int(self._cum[-1]), size=n)

    def __iter__(self) -> "TokenLoader":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._order is None:
            self._order = self._epoch_order(self.epoch)
        base = self.step * self.global_batch + self.rank * self.batch_size
        ids = self._order[base : base + self.batch_size]
        buf = _gather(self._shards, self._cum, ids, self.seq_len, self.mode == "packed")
        self.step += 1
        if self.step == self.steps_per_epoch:
            self.epoch, self.step, self._order = self.epoch + 1, 0, None
        return _inputs_and_targets(buf)

    def state_dict(self) -> dict:
        """Position and identity; the same on every rank."""
        return {
            "version": STATE_VERSION,
            "mode": self.mode,
            "seed": self.seed,
            "split": self.split,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "num_windows": self.num_windows,
            "tokenizer_sha256": self.dataset.tokenizer_sha256,
            "epoch": self.epoch,
            "step": self.step,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where the saved loader stopped: the next batch is the one the saved
        loader would have yielded next. Refuses a state from another data order."""
        mine = self.state_dict()
        for key in mine:
            if key not in state:
                raise DataError(f"loader state has no field {key!r}")
        for key in _IDENTITY_KEYS:
            if state[key] != mine[key]:
                raise DataError(
                    f"loader state does not match this loader: {key} is {state[key]!r} in the "
                    f"state, {mine[key]!r} here"
                )
        epoch, step = state["epoch"], state["step"]
        if not (
            isinstance(epoch, int)
            and epoch >= 0
            and isinstance(step, int)
            and 0 <= step < self.steps_per_epoch
        ):
            raise DataError(
                f"loader state position epoch={epoch!r} step={step!r} out of range "
                f"(steps_per_epoch {self.steps_per_epoch})"
            )
        self.epoch, self.step, self._order = epoch, step, None


def _packed_counts(shards: list[np.ndarray], seq_len: int) -> np.ndarray:
    """Packed windows per shard: a window needs T + 1 tokens (T inputs and the target after the
    last one), and consecutive windows share that one token."""
    lengths = np.array([len(m) for m in shards], dtype=np.int64)
    return np.maximum(lengths - 1, 0) // seq_len


def _inputs_and_targets(buf: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows (B, T + 1) -> x = their first T tokens, y = their last T, each (B, T)."""
    x = torch.from_numpy(np.ascontiguousarray(buf[:, :-1]))
    y = torch.from_numpy(np.ascontiguousarray(buf[:, 1:]))
    return x, y


def _gather(
    shards: list[np.ndarray], cum: np.ndarray, ids: np.ndarray, seq_len: int, packed: bool
) -> np.ndarray:
    """Window ids (B,) -> tokens (B, T + 1), int64, one gather per shard. cum[s] is the first id
    of shard s; a window's start is (id - cum[s]) * T when packed, else id - cum[s]."""
    shard = np.searchsorted(cum, ids, side="right") - 1
    local = ids - cum[shard]
    starts = local * seq_len if packed else local
    offsets = np.arange(seq_len + 1)
    buf = np.empty((len(ids), seq_len + 1), dtype=np.int64)
    for s in np.unique(shard):
        rows = shard == s
        buf[rows] = shards[s][starts[rows, None] + offsets]
    return buf


def _check_geometry(batch_size: int, seq_len: int, rank: int, world_size: int) -> None:
    if batch_size < 1 or seq_len < 1:
        raise DataError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise DataError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")


def split_windows(
    dataset: ShardDataset,
    split: str,
    seq_len: int,
    batch_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Every packed window of `split` exactly once, in shard order: the whole split for an
    evaluation whose result depends neither on a seed nor on a sample. Rank r takes the r-th of
    world_size contiguous, equal shares and yields it as (x, y) batches of at most batch_size
    windows. Equal shares give every rank the same number of forwards (a sharded model's forward
    is a collective), so the last total % world_size windows are left out."""
    _check_geometry(batch_size, seq_len, rank, world_size)
    shards = dataset.shards(split)
    cum = np.concatenate([[0], np.cumsum(_packed_counts(shards, seq_len))])
    total = int(cum[-1])
    if total == 0:
        raise DataError(f"split {split!r} of {dataset.path} has no window of {seq_len + 1} tokens")
    share = total // world_size
    if share == 0:
        raise DataError(
            f"split {split!r} of {dataset.path} has {total} windows of {seq_len + 1} tokens, "
            f"fewer than the {world_size} ranks"
        )
    ids = np.arange(rank * share, (rank + 1) * share)
    for start in range(0, len(ids), batch_size):
        yield _inputs_and_targets(
            _gather(shards, cum, ids[start : start + batch_size], seq_len, True)
        )
