"""ddp and fsdp2 on 2 real gloo ranks (torchrun) against the single-process run, resume across
world sizes, and a world size that does not divide the batch.

Tolerance: 1e-5 relative per step on the fp32 train loss, 1e-5 absolute on final weights. Same
global batch, same data (the loader's union over ranks is the global batch), same init (same seed);
what differs is only the order of fp32 additions in the gradient all-reduce / reduce-scatter
(sum of 2 rank means vs one accumulation), a few ulps (~1e-7 relative) per step, amplified by
Adam over 6 steps. Measured (4 steps): 2e-8 relative on the loss, 5e-7 on weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from ats_train_torchrun import (
    REFERENCE_EXTRA,
    STEPS,
    assert_ok,
    model_weights,
    run_args,
    run_ats_train,
    train_losses,
    train_records,
)

pytestmark = [pytest.mark.dist, pytest.mark.slow]

LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5


def _args(overrides, run_dir: Path, **extra: object) -> list[str]:  # noqa: ANN001
    """The reference's settings (conftest.single_reference), on another layout."""
    return run_args(overrides, run_dir, **REFERENCE_EXTRA, **extra)


def _assert_same_losses(got: dict[int, float], want: dict[int, float]) -> None:
    assert got.keys() <= want.keys() and got
    for step, loss in got.items():
        assert loss == pytest.approx(want[step], rel=LOSS_RTOL), f"step {step}"


@pytest.mark.parametrize(
    ("backend", "unit_blocks", "reshard"),
    [
        ("ddp", 1, True),
        ("fsdp2", 1, True),
        ("fsdp2", 1, False),
        ("fsdp2", 2, True),
        ("fsdp2", 0, True),
    ],
    ids=["ddp", "fsdp2", "fsdp2-no-reshard", "fsdp2-2-blocks-per-unit", "fsdp2-one-unit"],
)
def test_two_ranks_reproduce_the_single_process_run(
    backend: str, unit_blocks: int, reshard: bool, single_reference: Path, overrides, tmp_path: Path
) -> None:
    """Global batch 4: single runs 4 micro-batches of 1, each rank 2 (accumulation + no_sync)."""
    extra = (
        {
            "parallel__fsdp2__unit_blocks": unit_blocks,
            "parallel__fsdp2__reshard_after_forward": reshard,
        }
        if backend == "fsdp2"
        else {}
    )
    args = _args(overrides, tmp_path, parallel__backend=backend, **extra)
    assert_ok(run_ats_train(args, nproc=2))
    want = train_losses(single_reference)
    got = train_losses(tmp_path)
    assert got.keys() == want.keys() == set(range(1, STEPS + 1))
    _assert_same_losses(got, want)
    # every MoE / MoD layer reports its record on every step (fsdp2 shards per block; blocks
    # that lost their records would show fewer rows), and aux losses and statistics are means over
    # the ranks' micro-batches: the single run's means over the same four micro-batches.
    ref_records = train_records(single_reference)
    for step, record in train_records(tmp_path).items():
        for key in ("moe/entropy", "moe/expert_fraction", "mod/selected_fraction"):
            assert len(record[key]) == len(ref_records[step][key]), (step, key)
            np.testing.assert_allclose(record[key], ref_records[step][key], rtol=1e-5, atol=1e-6)
        aux = [k for k in record if k.startswith("aux/")]
        assert aux and aux == [k for k in ref_records[step] if k.startswith("aux/")]
        for key in aux:
            assert record[key] == pytest.approx(ref_records[step][key], rel=1e-5), (step, key)
        # the orchestrator's weight norms are the whole model's (fsdp2: summed over the shards)
        for key in ("param_norm", "update_ratio"):  # both every orchestrator.every steps
            want = ref_records[step].get(key)
            assert record.get(key) == (want if want is None else pytest.approx(want, rel=1e-5))
    assert any(r.get("update_ratio") is not None for r in ref_records.values())
    assert len(train_records(single_reference)[1]["moe/entropy"]) == 2  # tiny-hybrid: 2 MoE layers
    ref_w, w = model_weights(single_reference), model_weights(tmp_path)
    assert w.keys() == ref_w.keys()
    for name in ref_w:
        torch.testing.assert_close(w[name], ref_w[name], rtol=0, atol=WEIGHT_ATOL, msg=name)


def test_fsdp2_checkpoint_resumes_on_one_and_on_two_ranks(
    single_reference: Path, overrides, tmp_path: Path
) -> None:
    """Saved by fsdp2 on 2 ranks at step 4, continued to step 6 by `single` on 1 rank and by
    fsdp2 on 2 ranks: steps 5 and 6 match the uninterrupted single-process run."""
    saved = tmp_path / "saved"
    assert_ok(run_ats_train(_args(overrides, saved, train__steps=4, parallel__backend="fsdp2"), 2))
    assert (saved / "checkpoints" / "latest").read_text().strip() == "step-000004"
    want = train_losses(single_reference)
    for name, backend, nproc in (("on1", "single", None), ("on2", "fsdp2", 2)):
        run_dir = tmp_path / name
        shutil.copytree(saved, run_dir)
        assert_ok(run_ats_train(_args(overrides, run_dir, parallel__backend=backend), nproc))
        got = train_losses(run_dir)
        assert {5, 6} <= got.keys()
        _assert_same_losses(got, want)


def test_fsdp2_sharded_checkpoint_resumes_on_two_ranks_on_one_and_with_ddp(
    single_reference: Path, overrides, tmp_path: Path
) -> None:
    """checkpoint.format = sharded: fsdp2 on 2 ranks writes its DTensor optimizer shards to
    safetensors (one file per rank, nothing gathered) at step 4; fsdp2 on 2 ranks, `single` on 1
    and ddp on 2 continue to step 6 (resharded on load): steps 5-6 and the final weights, which need the
    restored Adam moments, match the uninterrupted single-process run."""
    saved = tmp_path / "saved"
    sharded = {"checkpoint__format": "sharded"}
    assert_ok(
        run_ats_train(
            _args(overrides, saved, train__steps=4, parallel__backend="fsdp2", **sharded), 2
        )
    )
    step4 = saved / "checkpoints" / "step-000004" / "trainer_state"
    assert not (step4 / "optimizer.json").exists()
    assert {p.name for p in (step4 / "optimizer_shards").iterdir()} == {
        "param_groups.json",
        *(f"rank-0000{r}.{ext}" for r in (0, 1) for ext in ("json", "safetensors")),
    }
    assert {p.name for p in (step4 / "rng").iterdir()} == {
        f"rank-0000{r}.{ext}" for r in (0, 1) for ext in ("json", "safetensors")
    }
    want = train_losses(single_reference)
    for name, backend, nproc in (("on2", "fsdp2", 2), ("on1", "single", None), ("ddp", "ddp", 2)):
        run_dir = tmp_path / name
        shutil.copytree(saved, run_dir)
        assert_ok(
            run_ats_train(_args(overrides, run_dir, parallel__backend=backend, **sharded), nproc)
        )
        got = train_losses(run_dir)
        assert {5, 6} <= got.keys()
        _assert_same_losses(got, want)
        ref_w, w = model_weights(single_reference), model_weights(run_dir)
        assert w.keys() == ref_w.keys()
        for key in ref_w:
            torch.testing.assert_close(w[key], ref_w[key], rtol=0, atol=WEIGHT_ATOL, msg=key)


def test_world_size_that_does_not_divide_the_batch_fails_clearly(overrides, tmp_path: Path) -> None:
    args = _args(overrides, tmp_path, parallel__backend="ddp", train__batch_size=3)
    proc = run_ats_train(args, nproc=2)
    assert proc.returncode != 0
    assert "train.batch_size = 3 is not divisible by the world size 2" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()
