"""TrainConfig: every training knob as a typed dataclass tree, loaded from TOML plus dotted overrides.

Architecture lives in ats_model.ModelConfig; the [model] section only names a preset and optional
overrides of that preset's fields. The resolved config is written to the run dir as config.toml, so
`ats-train --config RUN_DIR/config.toml` repeats a run.

    choices.py       the allowed values of string keys (Literal types) and the section checks
    sections.py      [model] [data] [train] [loss] [optim] [checkpoint] [profile]
    parallel.py      [parallel] and its table per backend ([parallel.fsdp2], [parallel.deepspeed])
    train_config.py  TrainConfig and the checks across sections
    keys.py          valid keys, their types, the nearest-key suggestion
    parse.py         TOML + `key=value` overrides -> TrainConfig
    toml_out.py      TrainConfig -> TOML
"""

from ats_train.config.keys import ALIASES, suggest_key, valid_keys
from ats_train.config.parallel import (
    ColossalAISettings,
    DeepSpeedSettings,
    FSDP2Settings,
    ParallelSection,
)
from ats_train.config.parse import build_config, coerce, load_config, parse_override
from ats_train.config.sections import (
    CheckpointSection,
    DataSection,
    LossSection,
    ModelSection,
    OptimSection,
    ProfileSection,
    TrainSection,
)
from ats_train.config.toml_out import to_dict, to_toml
from ats_train.config.train_config import TrainConfig
from ats_train.errors import ConfigError

__all__ = [
    "ALIASES",
    "CheckpointSection",
    "ColossalAISettings",
    "ConfigError",
    "DataSection",
    "DeepSpeedSettings",
    "FSDP2Settings",
    "LossSection",
    "ModelSection",
    "OptimSection",
    "ParallelSection",
    "ProfileSection",
    "TrainConfig",
    "TrainSection",
    "build_config",
    "coerce",
    "load_config",
    "parse_override",
    "suggest_key",
    "to_dict",
    "to_toml",
    "valid_keys",
]
