"""MoE aux-loss-free bias balancing on 2 real ranks: the ranks' expert loads differ, so their
in-forward bias updates differ; after every step the backend has made the biases identical."""

import json
from pathlib import Path

import pytest
from ats_train_torchrun import launch

pytestmark = [pytest.mark.dist, pytest.mark.slow]

RUNNER = Path(__file__).with_name("expert_bias_runner.py")


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_ranks_hold_identical_expert_biases_after_each_step(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "biases.json"
    proc = launch([str(RUNNER), backend, str(out)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    rank0, rank1 = record["after_forward"]
    assert rank0 != rank1  # unsynchronized, the ranks would drift apart
    assert any(b != 0.0 for layer in rank0 for b in layer)
    for step in record["after_step"]:
        assert step[0] == step[1]
