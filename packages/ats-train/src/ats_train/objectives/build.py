"""Config -> the post-training loader and objective: rows read and tokenized once (every bad row
fails here, naming its file:line, before anything is written), split into train and val."""

from __future__ import annotations

from collections.abc import Callable

import torch
from ats_data.errors import DataError
from ats_data.records import read_records
from ats_model import build_model
from ats_tokenizer.chat import IM_END
from torch import nn

from ats_train.batch_geometry import BatchGeometry
from ats_train.config import ConfigError, TrainConfig
from ats_train.objectives import Objective
from ats_train.objectives.batching import (
    Batch,
    ExampleLoader,
    pack,
    packed_batch,
    padded_batch,
    pair_batch,
    prompt_batch,
)
from ats_train.objectives.dpo import DPOObjective, precompute_reference
from ats_train.objectives.examples import check_length, dpo_pair, grpo_prompt, sft_sequence
from ats_train.objectives.grpo import GRPOObjective, Sampling
from ats_train.objectives.reference import (
    AdapterDisabledReference,
    FrozenReference,
    Reference,
)
from ats_train.objectives.rewards import resolve_reward
from ats_train.objectives.sft import SFTObjective
from ats_train.objectives.start import Start

EVAL_ROWS_PER_BATCH = 16


def split_rows(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) indices: a seeded permutation's first ceil(n * val_fraction) rows are val."""
    if n < 2:
        raise DataError(f"{n} rows: need at least 2 (one for training, one for validation)")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = min(max(1, -(-n * val_fraction // 1)), n - 1)
    n_val = int(n_val)
    return sorted(order[n_val:]), sorted(order[:n_val])


def _chunks(index: list[int], size: int) -> list[list[int]]:
    return [index[i : i + size] for i in range(0, len(index), size)]


def _rank_share(index: list[int], rank: int, world_size: int) -> list[int]:
    return index[rank::world_size]


class PostSetup:
    """The loader and the objective of a post-training run, built from its config and start."""

    def __init__(self, config: TrainConfig, start: Start) -> None:
        self.config, self.start = config, start
        self.tok = start.data.tokenizer
        self.records = list(read_records(config.data.source))
        self.train_index, self.val_index = split_rows(
            len(self.records), config.data.val_fraction, config.train.seed
        )

    def reference_model(self, device: torch.device) -> nn.Module:
        """A frozen copy of the initial weights (init_from, resized), on `device`."""
        model = build_model(self.start.model_config, device=device, kernels=self.config.kernels)
        model.load_state_dict(self.start.initial_state())
        return model

    def reference(self, raw_model: nn.Module, device: torch.device) -> Reference:
        """LoRA trains adapters on frozen base weights: the model with its adapters off is the
        initial policy, so no second model is built. Otherwise a frozen copy of init_from."""
        if self.config.train.trainable == "lora":
            return AdapterDisabledReference(raw_model)
        return FrozenReference(self.reference_model(device))

    def build(
        self, raw_model: nn.Module, batch: BatchGeometry, rank: int, device: torch.device
    ) -> tuple[ExampleLoader, Objective]:
        objective = self.config.train.objective
        if objective == "sft":
            return self._sft(batch, rank)
        if objective == "dpo":
            return self._dpo(raw_model, batch, rank, device)
        return self._grpo(raw_model, batch, rank, device)

    def _loader(
        self, n: int, make: Callable[[list[int]], Batch], batch: BatchGeometry, rank: int
    ) -> ExampleLoader:
        try:
            return ExampleLoader(
                n, make, batch.per_rank, seed=self.config.train.seed, rank=rank,
                world_size=batch.world_size,
            )  # fmt: skip
        except ValueError as e:
            raise ConfigError(
                f"data.source {self.config.data.source}: {e} (train.batch_size)"
            ) from e

    def _sft(self, batch: BatchGeometry, rank: int) -> tuple[ExampleLoader, Objective]:
        seq_len, pad = self.config.train.seq_len, self.tok.eos_id
        seqs = [sft_sequence(self.tok, r) for r in self.records]
        for s in seqs:
            check_length(len(s.ids), seq_len, s.where, "the example")
        train = [seqs[i] for i in self.train_index]
        val = [seqs[i] for i in _rank_share(self.val_index, rank, batch.world_size)]
        if self.config.sft.packing:
            rows = pack(train, seq_len, pad)

            def make(index: list[int]) -> Batch:
                return packed_batch([rows[i] for i in index])

            val_rows = pack(val, seq_len, pad)
            val_batches = [packed_batch(c) for c in _chunks(val_rows, EVAL_ROWS_PER_BATCH)]
            n = len(rows)
        else:

            def make(index: list[int]) -> Batch:
                return padded_batch([train[i] for i in index], pad)

            val_batches = [padded_batch(c, pad) for c in _chunks(val, EVAL_ROWS_PER_BATCH)]
            n = len(train)
        return self._loader(n, make, batch, rank), SFTObjective(val_batches)

    def _dpo(
        self, raw_model: nn.Module, batch: BatchGeometry, rank: int, device: torch.device
    ) -> tuple[ExampleLoader, Objective]:
        dpo, seq_len, pad = self.config.dpo, self.config.train.seq_len, self.tok.eos_id
        pairs = [dpo_pair(self.tok, r) for r in self.records]
        for p in pairs:
            for side in (p.chosen, p.rejected):
                check_length(len(side.ids), seq_len, p.where, "prompt + completion")
        train = [pairs[i] for i in self.train_index]
        val = [pairs[i] for i in _rank_share(self.val_index, rank, batch.world_size)]
        reference: Reference | None = self.reference(raw_model, device)
        val_batches = [pair_batch(c, pad, None) for c in _chunks(val, EVAL_ROWS_PER_BATCH)]
        ref = None  # (P, 2) summed reference log-probs of the train pairs, when precomputed
        if dpo.reference == "precomputed":
            chunks = [pair_batch(c, pad, None) for c in _chunks(train, EVAL_ROWS_PER_BATCH)]
            ref = precompute_reference(reference, chunks, device)
            for batch_ in val_batches:
                batch_[1]["ref_logps"] = precompute_reference(reference, [batch_], device)
            reference = None  # freed: no second model during training

        def make(index: list[int]) -> Batch:
            return pair_batch([train[i] for i in index], pad, None if ref is None else ref[index])

        objective = DPOObjective(dpo.beta, dpo.loss, reference, val_batches)
        return self._loader(len(train), make, batch, rank), objective

    def _grpo(
        self, raw_model: nn.Module, batch: BatchGeometry, rank: int, device: torch.device
    ) -> tuple[ExampleLoader, Objective]:
        grpo, train = self.config.grpo, self.config.train
        prompts = [grpo_prompt(self.tok, r) for r in self.records]
        for p in prompts:
            check_length(len(p.ids) + grpo.max_completion_tokens, train.seq_len, p.where,
                         f"the prompt + grpo.max_completion_tokens = {grpo.max_completion_tokens}")  # fmt: skip
        rewards = {name: resolve_reward(name) for name in grpo.rewards}
        weights = grpo.reward_weights or [1.0] * len(rewards)
        stops = tuple(
            sorted(
                {
                    self.tok.eos_id,
                    *[
                        self.tok.special_tokens[t]
                        for t in (IM_END,)
                        if t in self.tok.special_tokens
                    ],
                }
            )
        )
        sampling = Sampling(grpo.group_size, grpo.max_completion_tokens, grpo.temperature,
                            grpo.top_k, grpo.top_p, train.seed, rank)  # fmt: skip
        reference = self.reference(raw_model, device) if grpo.beta else None
        index = self.train_index

        def make(rows: list[int]) -> Batch:
            picked = [index[i] for i in rows]
            return prompt_batch([prompts[i] for i in picked], picked, self.tok.eos_id)

        objective = GRPOObjective(
            raw_model=raw_model, tokenizer=self.tok, prompts=prompts, rewards=rewards,
            weights=weights, sampling=sampling, scale=grpo.scale, loss_type=grpo.loss_type,
            epsilon=grpo.epsilon, epsilon_high=grpo.epsilon_high, beta=grpo.beta,
            reference=reference, stops=stops,
            val_index=_rank_share(self.val_index, rank, batch.world_size),
        )  # fmt: skip
        return self._loader(len(index), make, batch, rank), objective
