"""MoE aux-loss-free bias balancing on 2 real ranks: the ranks' expert loads differ, so their
in-forward bias updates differ; after every step the backend has made the biases identical.
The check (expert_bias_check.py) ran in conftest's one `rank_checks` launch."""

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_ranks_hold_identical_expert_biases_after_each_step(
    backend: str, rank_checks: dict
) -> None:
    record = rank_checks[f"expert_bias/{backend}"]
    rank0, rank1 = record["after_forward"]
    assert rank0 != rank1  # unsynchronized, the ranks would drift apart
    assert any(b != 0.0 for layer in rank0 for b in layer)
    for step in record["after_step"]:
        assert step[0] == step[1]
