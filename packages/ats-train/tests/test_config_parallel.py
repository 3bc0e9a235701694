"""[parallel]: the common backend key, one table per backend ([parallel.fsdp2], [parallel.deepspeed],
[parallel.colossalai]), a table's settings refused unless its backend is selected, and the flat keys
they replaced refused with their new name."""

import dataclasses
from pathlib import Path

import pytest
from ats_train.config import (
    ColossalAISettings,
    ConfigError,
    DeepSpeedSettings,
    FSDP2Settings,
    ParallelSection,
    load_config,
    to_toml,
    valid_keys,
)
from ats_train.config.parallel import RENAMED

TABLES = {"fsdp2": FSDP2Settings, "deepspeed": DeepSpeedSettings, "colossalai": ColossalAISettings}


def test_each_backend_reads_its_own_table_from_a_file_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        '[parallel]\nbackend = "deepspeed"\n'
        '[parallel.deepspeed]\nzero_stage = 3\noffload_optimizer = "cpu"\n'
        "offload_optimizer_ratio = 0.25\noffload_pin_memory = false\n"
    )
    config = load_config(path, ["parallel.deepspeed.offload_param=cpu"])
    assert config.parallel.deepspeed == DeepSpeedSettings(
        zero_stage=3,
        offload_optimizer="cpu",
        offload_param="cpu",
        offload_optimizer_ratio=0.25,
        offload_pin_memory=False,
    )
    assert config.parallel.fsdp2 == FSDP2Settings()  # the other tables keep their defaults
    again = tmp_path / "again.toml"
    again.write_text(to_toml(config))
    assert load_config(again) == config
    fsdp2 = load_config(
        None,
        ["parallel.backend=fsdp2", "parallel.fsdp2.unit_blocks=0"]
        + ["parallel.fsdp2.reshard_after_forward=false"],
    )
    assert fsdp2.parallel.fsdp2 == FSDP2Settings(unit_blocks=0, reshard_after_forward=False)


# Every setting of a table off its default, in a table its own checks accept (colossalai.plugin
# has one value, so its table has no other).
OFF_DEFAULT = {
    "fsdp2": FSDP2Settings(cpu_offload=True, unit_blocks=0, reshard_after_forward=False),
    "deepspeed": DeepSpeedSettings(
        zero_stage=3,
        offload_optimizer="cpu",
        offload_param="cpu",
        nvme_path="/nvme",
        offload_optimizer_ratio=0.5,
        offload_pin_memory=False,
        config="/ds.json",
    ),
}


def test_a_tables_settings_need_its_backend() -> None:
    """A table off its defaults with another backend selected is refused naming every such key,
    its value and the backend it needs; with that backend selected it is taken."""
    for backend, table in OFF_DEFAULT.items():
        default = type(table)()
        assert all(
            getattr(table, f.name) != getattr(default, f.name) for f in dataclasses.fields(table)
        )
        assert getattr(ParallelSection(backend=backend, **{backend: table}), backend) == table
    with pytest.raises(ConfigError) as caught:
        ParallelSection(backend="ddp", fsdp2=OFF_DEFAULT["fsdp2"])
    assert str(caught.value) == (
        "parallel.fsdp2.cpu_offload = true, parallel.fsdp2.unit_blocks = 0, "
        "parallel.fsdp2.reshard_after_forward = false need parallel.backend = 'fsdp2', not 'ddp'"
    )
    with pytest.raises(ConfigError) as caught:
        ParallelSection(backend="fsdp2", deepspeed=OFF_DEFAULT["deepspeed"])
    assert str(caught.value) == (
        "parallel.deepspeed.zero_stage = 3, parallel.deepspeed.offload_optimizer = 'cpu', "
        "parallel.deepspeed.offload_param = 'cpu', parallel.deepspeed.nvme_path = '/nvme', "
        "parallel.deepspeed.offload_optimizer_ratio = 0.5, "
        "parallel.deepspeed.offload_pin_memory = false, parallel.deepspeed.config = '/ds.json' "
        "need parallel.backend = 'deepspeed', not 'fsdp2'"
    )
    with pytest.raises(
        ConfigError,
        match="^parallel.deepspeed.zero_stage = 2 needs parallel.backend = 'deepspeed', not 'single'$",
    ):
        load_config(None, ["parallel.deepspeed.zero_stage=2"])


def test_every_flat_key_names_its_new_key(tmp_path: Path) -> None:
    """The flat [parallel] settings of before the per-backend tables: one line naming the new key,
    from the command line and from a file; every field of every table has its old name here."""
    keys = set(valid_keys())
    moved = {new for new in RENAMED.values()}
    assert moved == {
        f"parallel.{b}.{f.name}" for b, t in TABLES.items() for f in dataclasses.fields(t)
    }
    for old, new in RENAMED.items():
        assert new in keys and old not in keys
        with pytest.raises(ConfigError, match=f"^config key {old!r} was renamed; use {new!r}$"):
            load_config(None, [f"{old}=1"])
    path = tmp_path / "old.toml"
    path.write_text('[parallel]\nbackend = "deepspeed"\nzero_stage = 3\n')
    with pytest.raises(
        ConfigError, match="'parallel.zero_stage' was renamed; use 'parallel.deepspeed.zero_stage'"
    ):
        load_config(path)


@pytest.mark.parametrize("value", ["true", "3.0"])
def test_zero_stage_in_a_file_is_an_integer_stage(tmp_path: Path, value: str) -> None:
    """zero_stage is Literal[1, 2, 3]: true (== 1 in Python) and 3.0 (== 3) are not stages."""
    path = tmp_path / "run.toml"
    path.write_text(
        f'[parallel]\nbackend = "deepspeed"\n[parallel.deepspeed]\nzero_stage = {value}\n'
    )
    with pytest.raises(ConfigError, match="parallel.deepspeed.zero_stage = .* is not"):
        load_config(path)
