"""A resolved TrainConfig is immutable: every section and sub-table refuses assignment; a changed
setting is a new config (dataclasses.replace), checked again as it is built."""

import dataclasses

import pytest
from ats_train.config import ConfigError, TrainConfig, load_config


def _tables(obj: object, key: str) -> list[tuple[str, object]]:
    """(dotted key, dataclass) for `obj` and every dataclass inside it."""
    found = [(key, obj)]
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            found += _tables(value, f"{key}.{f.name}" if key else f.name)
    return found


def test_every_section_of_a_resolved_config_refuses_assignment() -> None:
    config = load_config(None, ["parallel.backend=fsdp2", "train.steps=5"])
    tables = _tables(config, "")
    # the top level, 11 sections, the 3 backend tables and the orchestrator's kinds
    assert len(tables) > 15 and {"parallel.fsdp2", "orchestrator.lr_cut"} <= {k for k, _ in tables}
    for _, table in tables:
        for f in dataclasses.fields(table):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(table, f.name, getattr(table, f.name))
            with pytest.raises(dataclasses.FrozenInstanceError):
                delattr(table, f.name)
    assert config.train.steps == 5


def test_a_changed_setting_is_a_new_config_checked_again() -> None:
    config = load_config(None, ["train.batch_size=8"])
    train = dataclasses.replace(config.train, batch_size=16, micro_batch_size=4)
    changed = dataclasses.replace(config, train=train)
    assert (changed.train.batch_size, config.train.batch_size) == (16, 8)
    assert changed.optim is config.optim  # untouched sections are shared, not copied
    with pytest.raises(ConfigError, match="train.batch_size = 16 is not a multiple"):
        dataclasses.replace(config.train, batch_size=16, micro_batch_size=3)
    with pytest.raises(ConfigError, match="lora.. is set but train.trainable = 'all'"):
        dataclasses.replace(changed, lora=dataclasses.replace(changed.lora, rank=4))


def test_resolved_defaults_stay_resolved_through_replace() -> None:
    """train.fused_loss = None resolves to a bool once, when the section is built; a replaced
    section keeps the resolved value."""
    train = TrainConfig().train
    assert train.fused_loss is True
    assert dataclasses.replace(train, steps=3).fused_loss is True
    assert load_config(None, ["train.precision=fp16"]).train.fused_loss is False
