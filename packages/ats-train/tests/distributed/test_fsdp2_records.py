"""FSDP2 per-block sharding keeps every block's MoE / MoD records: on 2 gloo ranks fed the same
batch, the sharded tiny-hybrid model (2 MoE layers, 1 MoD layer) gives the unsharded copy's loss,
aux losses (moe_lb, moe_z, mod_predictor), per-layer stats and gradients, with and without
activation checkpointing. Before blocks returned their records, FSDP2 rebuilt the shared context
argument and moe_lb came out halved. The checks (fsdp2_*_check.py) ran in conftest's one
`rank_checks` launch."""

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]

# fp32, same inputs: only the summation order of the 2-rank gradient average differs
RTOL, GRAD_ATOL = 1e-6, 1e-6


@pytest.mark.parametrize("mode", ["plain", "checkpointing"])
def test_sharded_blocks_return_every_record(mode: str, rank_checks: dict) -> None:
    result = rank_checks[f"fsdp2_records/{mode}"]
    assert result["n_moe_layers"] >= 2
    for step in result["steps"]:
        sharded, reference = step["sharded"], step["reference"]
        assert set(sharded["aux"]) == set(reference["aux"]) == {"moe_lb", "moe_z", "mod_predictor"}
        assert sharded["loss"] == pytest.approx(reference["loss"], rel=RTOL)
        for name, value in reference["aux"].items():
            assert sharded["aux"][name] == pytest.approx(value, rel=RTOL), name
        assert sharded["stats_rows"] == reference["stats_rows"]
        assert reference["stats_rows"]["moe/entropy"] == result["n_moe_layers"]
        assert step["grad_diff"] < GRAD_ATOL


def test_optimizer_step_on_unsharded_parameters_raises(rank_checks: dict) -> None:
    """The optimizer holds FSDP2's sharded parameters; stepping while a unit's unsharded ones are
    on the module (its post-backward never ran) would update nothing. On torch 2.11 + CUDA a
    root-only model did exactly that and trained nothing for 50 steps; now it is an error."""
    result = rank_checks["fsdp2_unsharded_step/reshard"]
    error = result["error"]
    assert error is not None and "still unsharded at the optimizer step" in error
    assert "tok_embeddings.weight" in error
    # tiny-dense's 2 blocks are 2 units: the first resharded after its forward, the last not
    gathered = result["unsharded_after_forward"]
    assert any(n.startswith("layers.1.") for n in gathered)
    assert not any(n.startswith("layers.0.") for n in gathered)


def test_fsdp2_without_resharding_keeps_every_unit_gathered_after_forward(
    rank_checks: dict,
) -> None:
    """parallel.fsdp2.reshard_after_forward = false: after a forward every unit's parameters are
    still gathered (the backward would need no second all-gather), the first block's included."""
    gathered = rank_checks["fsdp2_unsharded_step/no_reshard"]["unsharded_after_forward"]
    assert any(n.startswith("layers.0.") for n in gathered)
    assert any(n.startswith("layers.1.") for n in gathered)


def test_local_shard_update_is_torchs_clip_and_adamw(rank_checks: dict) -> None:
    """FSDP2's clip + fused AdamW run on each rank's local shards (fsdp2_local_step.py): the global
    norm, the update and the state checkpoints read (the DTensor optimizer's, gathered) equal
    torch's clip_grad_norm_ + AdamW on an unsharded copy, and an inf on one rank skips everywhere."""
    result = rank_checks["fsdp2_local_step"]
    for step in result["steps"][:3]:
        assert step["stepped"]
        assert step["norm"] == pytest.approx(step["ref_norm"], rel=1e-6)
        assert step["norm"] > 0.5  # the clip acted
    assert result["steps"][3]["stepped"] is False
    assert result["steps"][3]["norm"] == float("inf") == result["steps"][3]["ref_norm"]
    assert result["weight_diff"] < 1e-6
    assert result["state_diff"] < 1e-6
