"""parallel.backend = "colossalai": refused clearly where ColossalAI is missing (the workspace, torch
>= 2.11); inside the isolated env envs/colossalai (torch 2.5.1, colossalai 0.5.0) our code trains on
torch 2.5.1, ColossalAI's plugins refuse the CPU, and on CUDA 2 ranks of LowLevelZero (ZeRO-2)
reproduce the single-process run of the same env and resume across backends and world sizes.

The env tests skip unless envs/colossalai/setup.sh has built envs/colossalai/.venv (~3 GB from PyPI;
CI does not build it). Tolerances: as test_backends.py (fp32, same global batch and data, only the
order of additions in the gradient reduction differs): 1e-5 relative on the train loss, and 1e-5
absolute on final weights between the two torch versions' single runs (measured on CPU, 6 steps:
2e-8 and 1e-6); 1e-4 relative / 1e-4 absolute on CUDA, whose reductions reorder more.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ats_train.backends import build_backend
from ats_train.config import ColossalAISettings, ConfigError, ParallelSection
from ats_train.precision import build_precision
from ats_train_torchrun import ENV, free_port, model_weights, train_losses
from safetensors.torch import load_file

pytestmark = [pytest.mark.dist]

ROOT = Path(__file__).resolve().parents[4]
ENV_PYTHON = ROOT / "envs" / "colossalai" / ".venv" / "bin" / "python"
needs_env = pytest.mark.skipif(
    not ENV_PYTHON.exists(),
    reason="the isolated ColossalAI env is not built: run envs/colossalai/setup.sh (torch 2.5.1 + "
    "colossalai 0.5.0, ~3 GB from PyPI; CI and the GPU machine do not build it)",
)
STEPS = 6


def _in_env(
    args: list[str], nproc: int | None, entry: tuple[str, ...] = ("-m", "ats_train.cli")
) -> subprocess.CompletedProcess:
    """`ats-train ARGS` with the isolated env's python: one process, or torchrun with nproc ranks."""
    launcher = (
        []
        if nproc is None
        else ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone"]
    )
    cmd = [str(ENV_PYTHON), *launcher, *entry, *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


def _args(overrides, run_dir: Path, **extra: object) -> list[str]:
    values = {
        "train__steps": STEPS,
        "train__sample_tokens": 0,
        "train__precision": "fp32",
        "train__micro_batch_size": 1,
        "checkpoint__every": 2,
        "checkpoint__keep_last": 3,
        "optim__lr": 1e-3,
        "optim__min_lr": 1e-3,
        **extra,
    }
    return ["--run-dir", str(run_dir), *overrides(**values)]


def _ok(proc: subprocess.CompletedProcess) -> None:
    lines = [line for line in proc.stderr.splitlines() if "Warning" not in line]
    assert proc.returncode == 0, "\n".join(lines[:40] + ["..."] + lines[-40:])


def _assert_same_run(got: Path, want: Path, rtol: float, atol: float) -> None:
    got_losses, want_losses = train_losses(got), train_losses(want)
    assert got_losses.keys() == want_losses.keys() == set(range(1, STEPS + 1))
    for step, loss in got_losses.items():
        assert loss == pytest.approx(want_losses[step], rel=rtol), f"step {step}"
    got_w, want_w = model_weights(got), model_weights(want)
    assert got_w.keys() == want_w.keys()
    for name in want_w:
        torch.testing.assert_close(got_w[name], want_w[name], rtol=0, atol=atol, msg=name)


@pytest.mark.skipif(
    importlib.util.find_spec("colossalai") is not None,
    reason="ColossalAI is installed in this environment",
)
def test_missing_colossalai_names_the_isolated_env() -> None:
    cpu = torch.device("cpu")
    parallel = ParallelSection(backend="colossalai")
    with pytest.raises(ConfigError, match=r"not installed.*envs/colossalai/setup\.sh"):
        build_backend(parallel, cpu, build_precision("fp32", cpu))


def test_only_low_level_zero_is_a_plugin() -> None:
    with pytest.raises(
        ConfigError, match="colossalai.plugin = 'gemini' is not one of low_level_zero"
    ):
        ColossalAISettings(plugin="gemini")


@needs_env
@pytest.mark.slow  # importing colossalai takes ~10-30 s
def test_colossalai_refuses_the_cpu() -> None:
    """ColossalAI 0.5.0 itself: LowLevelZeroOptimizer asserts a cuda/npu accelerator. Should a
    later pin run on the CPU, this fails and the backend's CUDA-only check can go."""
    script = (
        "import torch, torch.distributed as dist\n"
        "from colossalai.booster import Booster\n"
        "from colossalai.booster.plugin import LowLevelZeroPlugin\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "model = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "Booster(plugin=LowLevelZeroPlugin(stage=2, precision='fp32')).boost(model, opt)\n"
    )
    port = str(free_port())
    env = {**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [str(ENV_PYTHON), "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "AssertionError: device is required" in proc.stderr


@needs_env
@pytest.mark.slow  # importing colossalai takes ~10-30 s
def test_backend_on_cpu_fails_with_one_clear_line(overrides, tmp_path: Path) -> None:
    proc = _in_env(_args(overrides, tmp_path, parallel__backend="colossalai"), nproc=None)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "ats-train train: error: parallel.backend = 'colossalai' needs train.device = 'cuda', "
        "not 'cpu': ColossalAI's LowLevelZero and Gemini plugins run on CUDA (or NPU) only"
    )


@pytest.fixture(scope="module")
def env_single(overrides, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single-process fp32 CPU run inside the env (torch 2.5.1)."""
    run_dir = tmp_path_factory.mktemp("env_single")
    _ok(_in_env(_args(overrides, run_dir), nproc=None))
    return run_dir


@needs_env
@pytest.mark.slow
def test_our_code_on_torch_2_5_matches_the_workspace_torch(
    env_single: Path, overrides, tmp_path: Path
) -> None:
    """The ats packages are installed --no-deps into the env (their metadata says torch >= 2.11):
    the single backend there reproduces the workspace run."""
    workspace_run = tmp_path / "workspace"
    workspace = subprocess.run(
        [sys.executable, "-m", "ats_train.cli", *_args(overrides, workspace_run)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _ok(workspace)
    _assert_same_run(env_single, workspace_run, rtol=1e-5, atol=1e-5)


@needs_env
@pytest.mark.slow
def test_cpu_emulation_two_ranks_reproduce_the_single_run_and_resume(
    env_single: Path, overrides, tmp_path: Path
) -> None:
    """Not a supported mode: envs/colossalai/cpu_emulation.py tells ColossalAI its CPU accelerator
    is "cuda" (streams as no-ops), so its real ZeRO-2 code runs on 2 gloo ranks and our backend's
    logic (gathered checkpoints, accumulation, clipping) is checked where no GPU has ColossalAI.
    Steps 1-4 on 2 colossalai ranks, its step-4 checkpoint (gathered weights and AdamW moments,
    what single would resume from) against single's, then steps 5-6 resumed by colossalai on 2
    ranks from it: the same run as single throughout."""
    emulation = (str(ROOT / "envs" / "colossalai" / "cpu_emulation.py"),)
    run = tmp_path / "colossalai"
    to4 = _args(overrides, run, train__steps=4, parallel__backend="colossalai")
    _ok(_in_env(to4, 2, emulation))
    step4 = Path("checkpoints") / "step-000004"
    for file in ("model.safetensors", "trainer_state/optimizer.safetensors"):
        got, want = load_file(str(run / step4 / file)), load_file(str(env_single / step4 / file))
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-5, msg=name)
    _ok(_in_env(_args(overrides, run, parallel__backend="colossalai"), 2, emulation))
    _assert_same_run(run, env_single, rtol=1e-5, atol=1e-5)


@needs_env
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.device_count() >= 2, reason="needs 2 CUDA devices")
def test_two_ranks_reproduce_the_single_run_and_resume(overrides, tmp_path: Path) -> None:
    """LowLevelZero on 2 GPUs vs `single` on 1, both in the env; then saved by colossalai on 2
    ranks at step 4 and continued to step 6 by single on 1 and by colossalai on 2."""
    cuda = {"train__device": "cuda"}
    reference, run = tmp_path / "single", tmp_path / "colossalai"
    _ok(_in_env(_args(overrides, reference, **cuda), nproc=None))
    _ok(_in_env(_args(overrides, run, parallel__backend="colossalai", **cuda), nproc=2))
    _assert_same_run(run, reference, rtol=1e-4, atol=1e-4)

    saved = tmp_path / "saved"
    to4 = _args(overrides, saved, train__steps=4, parallel__backend="colossalai", **cuda)
    _ok(_in_env(to4, nproc=2))
    assert (saved / "checkpoints" / "latest").read_text().strip() == "step-000004"
    for name, backend, nproc in (("on1", "single", None), ("on2", "colossalai", 2)):
        resumed = tmp_path / name
        shutil.copytree(saved, resumed)
        _ok(_in_env(_args(overrides, resumed, parallel__backend=backend, **cuda), nproc))
        _assert_same_run(resumed, reference, rtol=1e-4, atol=1e-4)
