"""Rows: a batch of named tensors sharing their first dimension (one entry per example or pair),
split into micro-batches and moved to the device as the pretraining (x, y) tensors are."""

from __future__ import annotations

import torch


class Rows(dict[str, torch.Tensor]):
    def __len__(self) -> int:
        return next(iter(self.values())).shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self),)

    def split(self, size: int) -> list[Rows]:
        parts = {k: v.split(size) for k, v in self.items()}
        n = len(next(iter(parts.values())))
        return [Rows({k: parts[k][i] for k in self}) for i in range(n)]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Rows:
        return Rows({k: v.to(device, non_blocking=non_blocking) for k, v in self.items()})
