"""train.overlap_host: the same run as the synchronous trainer (weights bit for bit, the same
metrics history), resumable from a checkpoint, each step recorded once, and refused where a step's
numbers must be read before the next step starts."""

import shutil
from pathlib import Path

import pytest
import torch
from ats_train.build import build_trainer
from ats_train.checkpoint import LATEST, checkpoints_dir
from ats_train.cli import main
from ats_train.config import build_config, load_config
from ats_train.errors import ConfigError


def _args(overrides, overlap: bool, **extra: object) -> list[str]:  # noqa: ANN001
    return overrides(orchestrator__mode="off", train__overlap_host=overlap, **extra)


def test_an_overlapped_run_is_the_synchronous_run(overrides, tmp_path: Path, assert_same_run):
    runs = {}
    for overlap in (False, True):
        runs[overlap] = tmp_path / f"overlap-{overlap}"
        assert main(["--run-dir", str(runs[overlap]), *_args(overrides, overlap)]) == 0
    assert_same_run(runs[True], runs[False])  # every step's record, val losses between them


def test_an_overlapped_run_resumes_bitwise(overrides, tmp_path: Path, assert_same_run):
    args = _args(overrides, True)
    ref = tmp_path / "ref"
    assert main(["--run-dir", str(ref), *args]) == 0
    resumed = tmp_path / "resumed"  # as if the run had died after writing step 4's checkpoint
    shutil.copytree(ref, resumed)
    shutil.rmtree(resumed / "model")
    shutil.rmtree(checkpoints_dir(resumed) / "step-000006")
    (checkpoints_dir(resumed) / LATEST).write_text("step-000004\n")
    assert main(["--run-dir", str(resumed), *args]) == 0
    assert_same_run(resumed, ref)


def test_train_step_returns_the_previous_steps_record(overrides, tmp_path: Path) -> None:
    with build_trainer(load_config(None, _args(overrides, True)), tmp_path) as trainer:
        assert trainer.train_step() == {}  # step 1 is queued, nothing recorded yet
        second = trainer.train_step()
        assert second["step"] == 1 and trainer.step == 2
        assert trainer.flush()["step"] == 2
        assert trainer.flush() is None


@pytest.mark.parametrize(
    ("extra", "what"),
    [
        ({"parallel__backend": "ddp"}, "parallel.backend = 'ddp'"),
        ({"train__precision": "fp16"}, "train.precision = 'fp16'"),
        ({"faults__nan_grad_at_step": 3}, "faults.nan_grad_at_step set"),
    ],
)
def test_what_acts_on_a_steps_numbers_first_is_refused(overrides, extra: dict, what: str) -> None:
    args = overrides(**{"orchestrator__mode": "off", "train__overlap_host": True, **extra})
    with pytest.raises(ConfigError, match=f"train.overlap_host = true cannot run with {what}"):
        load_config(None, args)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_an_overlapped_cuda_run_is_the_synchronous_run(prepared, tmp_path: Path, graphs: bool):
    """On CUDA the copy is asynchronous (pinned memory, an event) and the fused AdamW decides on
    the device: the same records and weights, bit for bit, as the trainer that waits."""
    shards, tokenizer = prepared
    results = {}
    for overlap in (False, True):
        flat = {
            "data.source": str(shards),
            "data.tokenizer": str(tokenizer),
            "model.preset": "tiny-moe",
            "model.dropout": 0.1,
            "model.ffn_dropout": 0.1,
            "train.steps": 6,
            "train.batch_size": 4,
            "train.seq_len": 32,
            "train.eval_every": 0,
            "train.device": "cuda",
            "train.precision": "bf16",
            "train.cuda_graphs": graphs,
            "train.sdpa_backend": "flash",  # named: "auto" may choose differently in each run
            "train.overlap_host": overlap,
            "orchestrator.mode": "off",
            "checkpoint.every": 0,
        }
        run_dir = tmp_path / f"overlap-{overlap}"
        run_dir.mkdir()
        with build_trainer(build_config(flat), run_dir) as trainer:
            records = [trainer.train_step() for _ in range(6)] + [trainer.flush()]
            records = [r for r in records if r]  # overlapped: {} first, the last from flush()
            keep = ("step", "loss", "grad_norm", "stepped", "moe/expert_fraction")
            weights = {n: p.detach().cpu() for n, p in trainer.raw_model.named_parameters()}
            results[overlap] = ([{k: r[k] for k in keep} for r in records], weights)
    assert [r["step"] for r in results[True][0]] == [1, 2, 3, 4, 5, 6]
    assert results[True][0] == results[False][0]
    for name, w in results[False][1].items():
        assert torch.equal(results[True][1][name], w), name
