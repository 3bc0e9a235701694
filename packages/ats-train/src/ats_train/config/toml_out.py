"""Writing: the resolved config as TOML (None values are omitted: TOML has no null)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from ats_train.config.train_config import TrainConfig
from ats_train.errors import ConfigError


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(
            f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{" + items + "}"
    raise ConfigError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def to_dict(config: TrainConfig) -> dict[str, Any]:
    """Nested plain dict; [model] overrides are merged into the model section."""
    out = dataclasses.asdict(config)
    model = out["model"]
    model.update(model.pop("overrides"))
    return out


def to_toml(config: TrainConfig) -> str:
    raw = to_dict(config)
    lines = ["# Resolved ats-train config (ats-train --config this_file repeats the run)."]
    for name, value in raw.items():
        if not isinstance(value, dict) and value is not None:
            lines.append(f"{name} = {_toml_value(value)}")
    for name, value in raw.items():
        if isinstance(value, dict):
            lines.append(f"\n[{name}]")
            for sub, sub_value in value.items():
                if sub_value is not None:
                    lines.append(f"{sub} = {_toml_value(sub_value)}")
    return "\n".join(lines) + "\n"
