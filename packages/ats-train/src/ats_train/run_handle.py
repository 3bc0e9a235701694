"""The Trainer as the orchestrator's RunHandle (orchestrator/handle.py): the reads it is allowed and
the one place where an intervention's change record (orchestrator/changes.py) becomes a change of
the run. Settings are replaced, never written in place: the run's TrainConfig is swapped for a copy
with the new value, so a section object anyone else holds keeps what it said.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from ats_data.loader import TokenLoader
from ats_model import flops_per_token
from torch import nn

from ats_train.batch_geometry import BatchGeometry
from ats_train.checkpoint import latest_checkpoint
from ats_train.expert_surgery import prune_experts, split_experts
from ats_train.orchestrator import changes

if TYPE_CHECKING:
    from ats_train.backends import Backend
    from ats_train.overlap import DeviceSums
    from ats_train.trainer import Trainer


class TrainerRunHandle:
    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    # ---- reads ---------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self._trainer.step

    @property
    def run_dir(self) -> Path:
        return self._trainer.run_dir

    @property
    def model(self) -> nn.Module:
        return self._trainer.raw_model

    @property
    def collectives(self) -> Backend:
        return self._trainer.backend

    @property
    def batch(self) -> BatchGeometry:
        return self._trainer.batch

    @property
    def flops_per_token(self) -> float:
        return self._trainer.flops_per_token

    def setting(self, key: str) -> Any:
        section, name = key.split(".")
        return getattr(getattr(self._trainer.config, section), name)

    @property
    def loss_tracks_progress(self) -> bool:
        objective = self._trainer.objective
        return objective is None or objective.loss_tracks_progress

    def weight_decays(self) -> list[float]:
        return [g["weight_decay"] for g in self._trainer.optimizer.param_groups]

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self._trainer.run_dir)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> DeviceSums:
        return self._trainer.forward_backward(x, y)

    def release_failed_step(self) -> None:
        self._trainer.optimizer.zero_grad(set_to_none=True)
        if self._trainer.backend.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- changes -------------------------------------------------------------------------------
    def _replace(self, section: str, **values: Any) -> None:
        config = self._trainer.config
        new = dataclasses.replace(getattr(config, section), **values)
        self._trainer.config = dataclasses.replace(config, **{section: new})

    def _structure_changed(self) -> None:
        """After prune / split: the backend clips the new tensors and the FLOPs per token follow
        the router's new expert count."""
        t = self._trainer
        t.backend.wrap(t.model, t.optimizer)
        t.flops_per_token = flops_per_token(t.raw_model.config, t.config.train.seq_len)

    def apply(self, change: changes.RunChange) -> None:
        t = self._trainer
        match change:
            case changes.SetGradClip(value):
                self._replace("optim", grad_clip=value)
            case changes.SetLossWeight(name, value):
                self._replace("loss", **{name: value})
            case changes.SetWeightDecay(group, value):
                t.optimizer.param_groups[group]["weight_decay"] = value
            case changes.SetMoE(attr, value):
                for layer in t.raw_model.moe_layers():
                    setattr(layer, attr, value)
            case changes.SetModCapacity(value):
                for layer in t.raw_model.mod_layers():
                    layer.capacity = value
            case changes.PruneExperts(keep):
                prune_experts(t.raw_model, t.optimizer, [list(k) for k in keep])
                self._structure_changed()
            case changes.SplitExperts(experts, noise_std):
                split_experts(t.raw_model, t.optimizer, list(experts), noise_std)
                self._structure_changed()
            case changes.SplitMicroBatch(size):
                t.batch = t.batch.with_micro_batch(size)
                self._replace("train", micro_batch_size=size)
            case changes.SetBatchSize(batch_size, micro):
                t.batch = BatchGeometry.of(batch_size, t.batch.world_size, micro)
                self._replace("train", batch_size=batch_size, micro_batch_size=micro)
                t.train_loader = _continued(t.train_loader, t.batch.per_rank)
            case changes.SetCadence(eval_every, checkpoint_every):
                self._replace("train", eval_every=eval_every)
                self._replace("checkpoint", every=checkpoint_every)
            case changes.SkipUpdate():
                t.optimizer.zero_grad(set_to_none=True)
            case changes.Rollback(path):
                t.overlap.discard()  # train.overlap_host: the step in flight ran past the fault
                t.load(path)
            case _:
                raise TypeError(f"not a run change: {change!r}")


def _continued(old: TokenLoader, per_rank: int) -> TokenLoader:
    """A loader of `per_rank` sequences per step at the same position in the same data order."""
    loader = TokenLoader(
        old.dataset,
        old.split,
        per_rank,
        old.seq_len,
        seed=old.seed,
        rank=old.rank,
        world_size=old.world_size,
        mode=old.mode,
    )
    consumed = old.step * old.global_batch  # windows of this epoch already used
    state = loader.state_dict()
    step = math.ceil(consumed / loader.global_batch)
    epoch = old.epoch + (1 if step >= loader.steps_per_epoch else 0)
    state.update(epoch=epoch, step=0 if step >= loader.steps_per_epoch else step)
    loader.load_state_dict(state)
    return loader
