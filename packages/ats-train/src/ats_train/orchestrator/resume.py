"""Settings the orchestrator changed (grad clip, loss weights, batch / micro-batch, cadence, expert
count) live in TrainConfig, which a resumed run reads afresh from the user's config. They are
kept in the checkpoint's orchestrator state and applied again here, before anything is built, so
that the loader, the model shape and the optimizer match the checkpoint."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ats_train.checkpoint import CheckpointError, load_tree

if TYPE_CHECKING:
    from ats_train.config import TrainConfig


def saved_settings(checkpoint: Path) -> dict[str, Any]:
    state = load_tree(checkpoint / "trainer_state", "state")
    return dict(state["orchestrator"]["settings"])


def with_saved_settings(config: TrainConfig, checkpoint: Path | None) -> TrainConfig:
    """A copy of `config` with the checkpoint's orchestrator settings applied (dotted keys)."""
    run = copy.deepcopy(config)
    if checkpoint is None:
        return run
    for key, value in saved_settings(checkpoint).items():
        section, name = key.split(".", 1)
        if section == "model":
            run.model.overrides[name] = value
            continue
        target = getattr(run, section)
        if name not in {f.name for f in dataclasses.fields(target)}:
            raise CheckpointError(f"{checkpoint}: orchestrator setting {key!r} is not a config key")
        setattr(target, name, value)
    return run
