"""Expert parallelism on 2 real gloo ranks (expert_parallel_check.py with DDP and
fsdp2_expert_parallel_check.py with the fsdp2 backend, run in conftest's one `rank_checks` launch)
against the unsharded model run on both ranks' tokens in one process, and
on 4 ranks (two EP groups of 2: expert replicas whose gradients are summed), in a launch of its own
since its world size differs.

Tolerance: the forward is the same arithmetic on the same rows (each expert's rows keep their
order), so losses, aux losses and statistics must match exactly up to float reassociation, 1e-6;
gradients 1e-6 absolute (the sum over two ranks' losses is added in another order).
"""

import json
from pathlib import Path

import pytest
from ats_train_torchrun import launch

pytestmark = [pytest.mark.dist, pytest.mark.slow]

ATOL = 1e-6


@pytest.mark.parametrize("routing", ["dropless", "capacity"])
def test_sharded_experts_reproduce_the_single_process_model(
    routing: str, rank_checks: dict
) -> None:
    record = rank_checks[f"expert_parallel/{routing}"]
    assert record["local_experts"] == [4, 4]  # tiny-moe: 8 experts, 4 per rank in both layers
    assert record["losses_differ"] > 1e-3  # the ranks saw different tokens
    dropped = max(record["dropped"])
    assert dropped > 0.05 if routing == "capacity" else dropped == 0.0
    for rank in range(2):
        forward = record["forward"][rank]
        assert {"loss", "moe_lb", "moe_z", "moe/tokens_per_expert", "moe/dropped_fraction"} <= (
            forward.keys()
        )
        for key, diff in forward.items():
            assert diff <= ATOL, (rank, key, diff)
        grads = record["grads"][rank]
        assert any(".experts.w1" in name for name in grads)
        for name, diff in grads.items():
            assert diff <= ATOL, (rank, name, diff)


@pytest.mark.parametrize("routing", ["dropless", "capacity"])
def test_ddp_with_sharded_experts_averages_and_clips_like_one_process(
    routing: str, rank_checks: dict
) -> None:
    """DDP for the dense weights, reduce_expert_grads for the experts, then clip_grad_norm to half
    the oracle's norm of the mean gradient: every gradient is half the oracle's mean gradient."""
    record = rank_checks[f"expert_parallel/{routing}"]
    norm, want = record["norm"]
    assert norm == pytest.approx(want, rel=1e-6)
    for rank in range(2):
        for name, diff in record["step_grads"][rank].items():
            assert diff <= ATOL, (rank, name, diff)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("expert_parallel_4") / "check.json"
    runner = Path(__file__).with_name("expert_parallel_runner.py")
    proc = launch([str(runner), str(out)], nproc=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_four_ranks_in_two_expert_groups_reproduce_the_single_process_model(
    four_ranks: dict,
) -> None:
    record = four_ranks["ddp"]
    assert record["replica_groups"] is True
    assert record["local_experts"] == [4, 4]
    assert max(record["dropped"]) > 0.05  # capacity_factor 1.0 drops slots
    norm, want = record["norm"]
    assert norm == pytest.approx(want, rel=1e-6)
    assert len(record["forward"]) == len(record["grads"]) == len(record["step_grads"]) == 4
    for rank in range(4):
        for what in ("forward", "grads", "step_grads"):
            for key, diff in record[what][rank].items():
                assert diff <= ATOL, (rank, what, key, diff)


def _assert_fsdp2_matches(record: dict, n_ranks: int) -> None:
    """fsdp2_expert_parallel_check.py's record: the forward as the oracle's, the global norm as
    the oracle's norm of the mean gradient, and every weight moved by half that gradient."""
    assert record["local_experts"] == [4, 4]
    assert record["experts"] and all(".experts.w" in name for name in record["experts"])
    assert record["sharded"] and not set(record["sharded"]) & set(record["experts"])
    norm, want = record["norm"]
    assert record["stepped"] and norm == pytest.approx(want, rel=1e-6)
    assert len(record["forward"]) == len(record["moved"]) == n_ranks
    for rank in range(n_ranks):
        forward = record["forward"][rank]
        assert {"loss", "moe_lb", "moe_z", "moe/tokens_per_expert"} <= forward.keys()
        assert set(record["experts"]) | set(record["sharded"]) == record["moved"][rank].keys()
        for what in ("forward", "moved"):
            for key, diff in record[what][rank].items():
                assert diff <= ATOL, (rank, what, key, diff)


@pytest.mark.parametrize("routing", ["dropless", "capacity"])
def test_fsdp2_with_sharded_experts_steps_like_one_process(routing: str, rank_checks: dict) -> None:
    """fsdp2 backend, 2 ranks = EP 2: the experts are not replicated, nothing reduces them."""
    record = rank_checks[f"fsdp2_expert_parallel/{routing}"]
    dropped = max(record["dropped"])
    assert dropped > 0.05 if routing == "capacity" else dropped == 0.0
    _assert_fsdp2_matches(record, 2)


def test_fsdp2_on_four_ranks_in_two_expert_groups_steps_like_one_process(four_ranks: dict) -> None:
    """fsdp2 over 4 ranks, EP groups of 2: each expert shard's gradient summed over its 2 holders,
    its squares counted once in the global norm."""
    record = four_ranks["fsdp2"]
    assert max(record["dropped"]) > 0.05
    _assert_fsdp2_matches(record, 4)
