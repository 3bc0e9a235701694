"""Examples -> fixed training rows, and the loader that deals them out with exact resume.

SFT rows are packed (several examples per row of train.seq_len tokens, each its own document:
forward's document_ids keeps attention and RoPE positions within it) or padded (one example per
row, right-padded to the longest row of the batch, with a key-padding mask). benchmarks/
post_training.py --measure-packing compares the two. DPO rows are padded pairs (chosen, rejected);
GRPO rows are left-padded prompts (generation appends to the right)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ats_train.objectives.examples import Pair, Prompt, Sequence
from ats_train.objectives.logprobs import IGNORE
from ats_train.objectives.rows import Rows

Batch = tuple[Rows, Rows]  # (inputs, targets), as the pretraining loader's (x, y)


def labels_of(seq: Sequence) -> list[int]:
    """Position t predicts ids[t + 1], scored where mask[t + 1] is 1; the last predicts nothing."""
    return [i if m else IGNORE for i, m in zip(seq.ids[1:], seq.mask[1:], strict=True)] + [IGNORE]


def pack(seqs: list[Sequence], seq_len: int, pad_id: int) -> list[tuple[list, list, list]]:
    """Greedy, in order: each row takes examples while they fit; (ids, labels, document ids)
    per row, the tail padding its own document with no labels."""
    rows: list[tuple[list, list, list]] = []
    ids: list[int] = []
    labels: list[int] = []
    docs: list[int] = []
    for seq in seqs:
        if len(ids) + len(seq.ids) > seq_len:
            rows.append((ids, labels, docs))
            ids, labels, docs = [], [], []
        doc = docs[-1] + 1 if docs else 0
        ids += seq.ids
        labels += labels_of(seq)
        docs += [doc] * len(seq.ids)
    if ids:
        rows.append((ids, labels, docs))
    out = []
    for ids, labels, docs in rows:
        n = seq_len - len(ids)
        out.append((ids + [pad_id] * n, labels + [IGNORE] * n, docs + [docs[-1] + 1] * n))
    return out


def packed_batch(rows: list[tuple[list, list, list]]) -> Batch:
    ids, labels, docs = (torch.tensor([r[i] for r in rows]) for i in range(3))
    return Rows(ids=ids, document_ids=docs), Rows(labels=labels)


def _right_pad(seqs: list[Sequence], pad_id: int, width: int) -> tuple[torch.Tensor, ...]:
    """(ids, attention_mask, labels) (B, width) of right-padded sequences."""
    ids = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), IGNORE)
    for b, seq in enumerate(seqs):
        n = len(seq.ids)
        ids[b, :n] = torch.tensor(seq.ids)
        mask[b, :n] = 1
        labels[b, :n] = torch.tensor(labels_of(seq))
    return ids, mask, labels


def padded_batch(seqs: list[Sequence], pad_id: int) -> Batch:
    ids, mask, labels = _right_pad(seqs, pad_id, max(len(s.ids) for s in seqs))
    return Rows(ids=ids, attention_mask=mask), Rows(labels=labels)


def pair_batch(pairs: list[Pair], pad_id: int, ref_logps: torch.Tensor | None) -> Batch:
    """ids, attention_mask, labels (P, 2, T): [:, 0] chosen, [:, 1] rejected; ref_logps (P, 2)."""
    seqs = [s for p in pairs for s in (p.chosen, p.rejected)]
    width = max(len(s.ids) for s in seqs)
    ids, mask, labels = (t.view(len(pairs), 2, width) for t in _right_pad(seqs, pad_id, width))
    targets = Rows(labels=labels)
    if ref_logps is not None:
        targets["ref_logps"] = ref_logps
    return Rows(ids=ids, attention_mask=mask), targets


def prompt_batch(prompts: list[Prompt], index: list[int], pad_id: int) -> Batch:
    """Left-padded prompt ids and mask (B, Tp); targets: each prompt's row index."""
    width = max(len(p.ids) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p.ids) :] = torch.tensor(p.ids)
        mask[b, width - len(p.ids) :] = 1
    return Rows(ids=ids, attention_mask=mask), Rows(row=torch.tensor(index))


class ExampleLoader:
    """Deals `per_rank` examples to each rank per step: every epoch a permutation seeded by
    (seed, epoch); a global batch is the next per_rank * world_size indices, this rank's slice
    its share; an epoch's tail shorter than a global batch is dropped. State: (epoch, offset)."""

    def __init__(
        self,
        n: int,
        make: Callable[[list[int]], Batch],
        per_rank: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.n, self.make, self.per_rank = n, make, per_rank
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.global_batch = per_rank * world_size
        if n < self.global_batch:
            raise ValueError(
                f"{n} training rows, fewer than one global batch of {self.global_batch}"
            )
        self.epoch, self.offset = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> ExampleLoader:
        return self

    def __next__(self) -> Batch:
        if self.offset + self.global_batch > self.n:
            self.epoch, self.offset = self.epoch + 1, 0
            self._order = self._permutation()
        start = self.offset + self.rank * self.per_rank
        index = self._order[start : start + self.per_rank]
        self.offset += self.global_batch
        return self.make(index)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation()
