"""Bad launches of ddp and fsdp2: outside torchrun (a clear error naming the missing variables,
exit status 2), CPU offload without a GPU."""

import pytest
import torch
from ats_train.backends import build_backend
from ats_train.backends.process_group import TORCHRUN_ENV
from ats_train.cli import main
from ats_train.config import ConfigError, FSDP2Settings, ParallelSection
from ats_train.precision import build_precision


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_without_torchrun_env_names_what_is_missing(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "0")
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match="WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not"):
        build_backend(ParallelSection(backend=backend), cpu, build_precision("fp32", cpu))


def test_cli_without_torchrun_exits_2_with_one_line(
    overrides,  # noqa: ANN001
    tmp_path,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In process, as test_cli.py runs the CLI (the distributed tests run its real entry point)."""
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    capsys.readouterr()
    assert main(["--run-dir", str(tmp_path), *overrides(parallel__backend="ddp")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ats-train train: error: parallel.backend = 'ddp' needs")
    assert err.count("\n") == 1


def test_fsdp2_cpu_offload_on_cpu_is_refused() -> None:
    cpu = torch.device("cpu")
    parallel = ParallelSection(backend="fsdp2", fsdp2=FSDP2Settings(cpu_offload=True))
    with pytest.raises(
        ConfigError, match="parallel.fsdp2.cpu_offload = true needs train.device = 'cuda'"
    ):
        build_backend(parallel, cpu, build_precision("fp32", cpu))
