"""BatchGeometry: how a global batch of sequences is split over ranks and micro-batches.

Resolved once from [train] and the world size, then passed to whoever needs a batch size (the
trainer, the loaders, the DeepSpeed JSON, the CUDA-graph checks, the orchestrator's batch
changes): nothing else divides batch sizes.

    global_batch = world_size x per_rank = world_size x accumulation x micro_batch
"""

from __future__ import annotations

from dataclasses import dataclass

from ats_train.errors import ConfigError


@dataclass(frozen=True)
class BatchGeometry:
    global_batch: int  # sequences per optimizer step, over all ranks (train.batch_size)
    world_size: int
    per_rank: int  # sequences one rank backpropagates per optimizer step
    micro_batch: int  # sequences one rank runs at once (train.micro_batch_size)
    accumulation: int  # micro-batches per rank per optimizer step

    @classmethod
    def of(cls, global_batch: int, world_size: int, micro_batch: int | None) -> BatchGeometry:
        """The split of `global_batch` over `world_size` ranks in micro-batches of `micro_batch`
        (None: the whole per-rank batch at once, no accumulation); ConfigError if it is not
        whole."""
        if global_batch % world_size:
            raise ConfigError(
                f"train.batch_size = {global_batch} is not divisible by the world size {world_size}"
            )
        per_rank = global_batch // world_size
        micro = per_rank if micro_batch is None else micro_batch
        if per_rank % micro:
            raise ConfigError(
                f"train.batch_size = {global_batch} over {world_size} rank(s) gives {per_rank} "
                f"sequences per rank, not a multiple of train.micro_batch_size = {micro}"
            )
        return cls(global_batch, world_size, per_rank, micro, per_rank // micro)

    def with_micro_batch(self, micro_batch: int) -> BatchGeometry:
        """The same global batch in micro-batches of `micro_batch` (more or less accumulation)."""
        return BatchGeometry.of(self.global_batch, self.world_size, micro_batch)

    def with_global_batch(self, global_batch: int) -> BatchGeometry:
        """`global_batch` sequences per step in the same micro-batches (accumulation changes)."""
        return BatchGeometry.of(global_batch, self.world_size, self.micro_batch)

    def with_micro_batch_halved(self) -> BatchGeometry:
        """Micro-batches of the largest divisor of the per-rank batch up to half the current one
        (an out-of-memory retry); the global batch stays. Needs micro_batch > 1."""
        half = self.micro_batch // 2
        return self.with_micro_batch(max(d for d in range(1, half + 1) if self.per_rank % d == 0))
