"""train.cuda_graphs: what the config refuses (CPU), and graphed training == eager training (GPU)."""

from pathlib import Path

import pytest
import torch
from ats_train.batch_geometry import BatchGeometry
from ats_train.build import build_trainer
from ats_train.config import ConfigError, build_config
from ats_train.cuda_graphs import check_cuda_graphs
from ats_train.model_config import build_model_config

CUDA = torch.device("cuda")


def _config(prepared: tuple[Path, Path], **extra: object):
    shards, tokenizer = prepared
    flat = {
        "data.source": str(shards),
        "data.tokenizer": str(tokenizer),
        "model.preset": "tiny-moe",
        "train.steps": 6,
        "train.batch_size": 4,
        "train.seq_len": 32,
        "train.eval_every": 0,
        "train.device": "cuda",
        "train.cuda_graphs": True,
        "checkpoint.every": 0,
        **extra,
    }
    return build_config(flat)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"train.micro_batch_size": 2}, "train.micro_batch_size = 2 accumulates"),
        ({"model.preset": "tiny-mod"}, "model.family is 'mod'"),
        ({"model.moe.capacity_factor": 1.25}, "model.moe.capacity_factor is set"),
        ({"faults.oom_at_step": 3}, "faults.oom_at_step = 3"),
        ({"kernels": "reference"}, "kernels = 'reference' with MoE"),
    ],
)
def test_refuses_what_graphs_cannot_replay(prepared, extra: dict, message: str) -> None:
    config = _config(prepared, **extra)
    model = build_model_config(config.model, 320, config.train.seq_len)
    with pytest.raises(ConfigError, match=message):
        batch = BatchGeometry.of(config.train.batch_size, 1, config.train.micro_batch_size)
        check_cuda_graphs(config, model, CUDA, batch)


def test_refuses_cpu_before_writing_anything(prepared, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train.device is 'cpu'"):
        build_trainer(_config(prepared, **{"train.device": "cpu"}), tmp_path)
    assert list(tmp_path.iterdir()) == []


def _losses_and_weights(
    prepared, run_dir: Path, graphs: bool, preset: str, sdpa: str, compile: bool = False
):
    run_dir.mkdir()
    config = _config(
        prepared,
        **{
            "model.preset": preset,
            "train.cuda_graphs": graphs,
            "train.precision": "bf16",
            "model.dropout": 0.1,
            "train.sdpa_backend": sdpa,  # named: "auto" may choose differently in each run
            "train.compile": compile,
        },
    )
    with build_trainer(config, run_dir) as trainer:
        losses = [trainer.train_step()["loss"] for _ in range(6)]
        weights = {n: p.detach().float().cpu() for n, p in trainer.raw_model.named_parameters()}
    return losses, weights


@pytest.mark.gpu
@pytest.mark.parametrize("sdpa", ["flash", "cudnn"])
@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
def test_graphed_training_matches_eager(prepared, tmp_path: Path, preset: str, sdpa: str) -> None:
    """Same seed, same batches: the replayed graphs compute what eager does (dropout on: the CUDA
    generator advances the same way), and two graphed runs are bitwise equal."""
    eager, w_eager = _losses_and_weights(prepared, tmp_path / "eager", False, preset, sdpa)
    graphed, w_graphed = _losses_and_weights(prepared, tmp_path / "graphed", True, preset, sdpa)
    again, w_again = _losses_and_weights(prepared, tmp_path / "again", True, preset, sdpa)
    assert graphed == again
    assert all(torch.equal(w_graphed[n], w_again[n]) for n in w_graphed)
    assert graphed == pytest.approx(eager, rel=2e-3), (graphed, eager)
    for name, w in w_eager.items():
        torch.testing.assert_close(w_graphed[name], w, rtol=2e-2, atol=2e-3, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
def test_graphed_compiled_training_matches_compiled_eager(
    prepared, tmp_path: Path, preset: str
) -> None:
    """train.compile + train.cuda_graphs: the compiled blocks, captured after capture's warm-up
    compiled them, train as the compiled eager run does."""
    eager, w_eager = _losses_and_weights(prepared, tmp_path / "eager", False, preset, "flash", True)
    graphed, w_graphed = _losses_and_weights(
        prepared, tmp_path / "graphed", True, preset, "flash", True
    )
    assert graphed == pytest.approx(eager, rel=2e-3), (graphed, eager)
    for name, w in w_eager.items():
        torch.testing.assert_close(w_graphed[name], w, rtol=2e-2, atol=2e-3, msg=name)
