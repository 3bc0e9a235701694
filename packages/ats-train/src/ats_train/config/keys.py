"""The dotted keys a config accepts (ModelConfig's fields included), each key's type, and the
nearest valid key for a wrong one: an alias by meaning first, then the closest spelling."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from ats_train.config.parallel import RENAMED as PARALLEL_RENAMED
from ats_train.config.train_config import TrainConfig
from ats_train.errors import ConfigError
from ats_train.orchestrator.settings import RENAMED as ORCHESTRATOR_RENAMED

# keys that moved: an intervention kind's generic knobs, the flat [parallel] backend settings
RENAMED = {**ORCHESTRATOR_RENAMED, **PARALLEL_RENAMED}


def _model_fields() -> dict[str, Any]:
    """ModelConfig field name -> type hint; [model] overrides are checked against these."""
    from ats_model import ModelConfig

    return typing.get_type_hints(ModelConfig)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _section_types() -> dict[str, type]:
    return {
        name: hint for name, hint in _hints(TrainConfig).items() if dataclasses.is_dataclass(hint)
    }


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass inside a hint such as `MoEConfig | None`, else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def valid_keys() -> list[str]:
    """Every dotted key a config accepts, ModelConfig fields (and their sub-configs') included."""
    keys = []
    for name, hint in _hints(TrainConfig).items():
        if dataclasses.is_dataclass(hint):
            for sub, sub_hint in _hints(hint).items():
                if (name, sub) == ("model", "overrides"):
                    continue
                if dataclasses.is_dataclass(sub_hint):  # e.g. orchestrator.lr_cut.enabled
                    keys.extend(f"{name}.{sub}.{leaf}" for leaf in _hints(sub_hint))
                else:
                    keys.append(f"{name}.{sub}")
        else:
            keys.append(name)
    for name, hint in _model_fields().items():
        sub = _dataclass_in(hint)
        keys.append(f"model.{name}")
        if sub is not None:
            keys.extend(f"model.{name}.{field_name}" for field_name in _hints(sub))
    return keys


# Names other trainers use for a knob (by meaning: edit distance alone sends `learning_rate` to
# `min_lr`). A key's last part is looked up here before the spelling is compared.
ALIASES = {
    "learning_rate": "lr",
    "max_lr": "lr",
    "peak_lr": "lr",
    "final_lr": "min_lr",
    "lr_min": "min_lr",
    "wd": "weight_decay",
    "adam_betas": "betas",
    "adam_eps": "eps",
    "epsilon": "eps",
    "clip_grad": "grad_clip",
    "max_grad_norm": "grad_clip",
    "gradient_clipping": "grad_clip",
    "warmup": "warmup_steps",
    "warmup_iters": "warmup_steps",
    "lr_schedule": "schedule",
    "scheduler": "schedule",
    "max_steps": "steps",
    "max_iters": "steps",
    "iters": "steps",
    "num_steps": "steps",
    "block_size": "seq_len",
    "context_length": "seq_len",
    "seq_length": "seq_len",
    "gradient_accumulation_steps": "micro_batch_size",
    "micro_batch": "micro_batch_size",
    "dtype": "precision",
    "mixed_precision": "precision",
}


def suggest_key(key: str, keys: list[str]) -> str | None:
    """The valid key `key` most likely means: an alias of its last part in the same section
    (or any section), else the closest spelling."""
    *section, last = key.split(".")
    if last in ALIASES:
        wanted = [k for k in keys if k.split(".")[-1] == ALIASES[last]]
        same_section = [k for k in wanted if k.split(".")[:-1] == section]
        if same_section or wanted:
            return (same_section or wanted)[0]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    return close[0] if close else None


def _unknown_key(key: str) -> ConfigError:
    if key in RENAMED:
        return ConfigError(f"config key {key!r} was renamed; use {RENAMED[key]!r}")
    close = suggest_key(key, valid_keys())
    hint = f"; did you mean {close!r}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def _hint_for(key: str) -> Any:
    """Type hint of a dotted key, or raise with the nearest valid key."""
    parts = key.split(".")
    top = _hints(TrainConfig)
    if len(parts) == 1 and parts[0] in top and not dataclasses.is_dataclass(top[parts[0]]):
        return top[parts[0]]
    if len(parts) == 2 and parts[0] in top and dataclasses.is_dataclass(top[parts[0]]):
        section = _hints(top[parts[0]])
        if parts[1] in section and parts[1] != "overrides":
            return section[parts[1]]
    if len(parts) == 3 and parts[0] in top and dataclasses.is_dataclass(top[parts[0]]):
        # a section's sub-table, e.g. orchestrator.lr_cut
        table = _hints(top[parts[0]]).get(parts[1])
        if dataclasses.is_dataclass(table) and parts[2] in _hints(table):
            return _hints(table)[parts[2]]
    if parts[0] == "model" and len(parts) in (2, 3):
        model_fields = _model_fields()
        if parts[1] in model_fields:
            if len(parts) == 2:
                return model_fields[parts[1]]
            sub = _dataclass_in(model_fields[parts[1]])
            if sub is not None and parts[2] in _hints(sub):
                return _hints(sub)[parts[2]]
    raise _unknown_key(key)
