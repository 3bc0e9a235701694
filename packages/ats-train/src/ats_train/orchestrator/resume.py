"""Settings the orchestrator changed (grad clip, loss weights, batch / micro-batch, cadence, expert
count) live in TrainConfig, which a resumed run reads afresh from the user's config. They are
kept in the checkpoint's orchestrator state and applied again here, before anything is built, so
that the loader, the model shape and the optimizer match the checkpoint."""

from __future__ import annotations

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
    """A new config: `config` with the checkpoint's orchestrator settings (dotted keys) applied."""
    if checkpoint is None:
        return config
    sections = {
        f.name
        for f in dataclasses.fields(config)
        if dataclasses.is_dataclass(getattr(config, f.name))
    }
    changed: dict[str, dict[str, Any]] = {}
    for key, value in saved_settings(checkpoint).items():
        section, name = key.split(".", 1)
        known = section == "model" or (
            section in sections
            and name in {f.name for f in dataclasses.fields(getattr(config, section))}
        )
        if not known:
            raise CheckpointError(f"{checkpoint}: orchestrator setting {key!r} is not a config key")
        changed.setdefault(section, {})[name] = value
    if "model" in changed:  # model.* are overrides of the preset's ModelConfig fields
        overrides = {**config.model.overrides, **changed["model"]}
        changed["model"] = {"overrides": overrides}
    return dataclasses.replace(
        config,
        **{
            section: dataclasses.replace(getattr(config, section), **values)
            for section, values in changed.items()
        },
    )
