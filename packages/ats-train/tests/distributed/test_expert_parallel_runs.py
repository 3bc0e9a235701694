"""parallel.expert_parallel = 2 through the real `ats-train` CLI on 2 gloo ranks, with ddp and with
fsdp2 for the rest of the model: the run reproduces the single-process run
(conftest.single_reference), and its checkpoints, which hold full expert tensors and full Adam
moments, resume with the experts replicated, on the other backend, and back.

Tolerances as test_backends.py's (the same runs, the same fp32 reassociation of the gradient sums).
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
# expert surgery needs every expert on one rank (config refuses it with expert_parallel > 1); in
# the reference neither kind fires before orchestrator.min_records = 8 records
NO_SURGERY = {
    "orchestrator__prune_experts__enabled": False,
    "orchestrator__split_expert__enabled": False,
}


def _args(overrides, run_dir: Path, backend: str, **extra: object) -> list[str]:  # noqa: ANN001
    ep = {"parallel__expert_parallel": 2, **NO_SURGERY}
    return run_args(overrides, run_dir, **REFERENCE_EXTRA, parallel__backend=backend, **ep, **extra)


def _assert_same_losses(got: dict[int, float], want: dict[int, float]) -> None:
    assert got.keys() <= want.keys() and got
    for step, loss in got.items():
        assert loss == pytest.approx(want[step], rel=LOSS_RTOL), f"step {step}"


def _assert_same_weights(run_dir: Path, reference: Path) -> None:
    ref_w, w = model_weights(reference), model_weights(run_dir)
    assert w.keys() == ref_w.keys()
    assert w["layers.1.ffn.experts.w1"].shape[0] == 8  # tiny-hybrid: all 8 experts, gathered
    for name in ref_w:
        torch.testing.assert_close(w[name], ref_w[name], rtol=0, atol=WEIGHT_ATOL, msg=name)


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_expert_parallel_2_reproduces_the_single_process_run(
    backend: str, single_reference: Path, overrides, tmp_path: Path
) -> None:
    """Losses, aux losses, MoE statistics, the clipped gradient norm (grad_norm: the dense part
    from DDP's replicas or FSDP2's shards, each expert shard counted once) and the final weights."""
    # with a sample after training: generation's forwards exchange tokens too, in step on both ranks
    proc = run_ats_train(_args(overrides, tmp_path, backend, train__sample_tokens=8), nproc=2)
    assert_ok(proc)
    assert "sample" in proc.stdout
    want, got = train_losses(single_reference), train_losses(tmp_path)
    assert got.keys() == want.keys() == set(range(1, STEPS + 1))
    _assert_same_losses(got, want)
    ref_records = train_records(single_reference)
    for step, record in train_records(tmp_path).items():
        for key in ("moe/entropy", "moe/expert_fraction", "moe/dropped_fraction", "grad_norm"):
            np.testing.assert_allclose(record[key], ref_records[step][key], rtol=1e-5, atol=1e-6)
        aux = [k for k in record if k.startswith("aux/")]
        assert aux and aux == [k for k in ref_records[step] if k.startswith("aux/")]
        for key in aux:
            assert record[key] == pytest.approx(ref_records[step][key], rel=1e-5), (step, key)
        for key in ("param_norm", "update_ratio"):
            want_value = ref_records[step].get(key)
            assert record.get(key) == (
                want_value if want_value is None else pytest.approx(want_value, rel=1e-5)
            ), (step, key)
    _assert_same_weights(tmp_path, single_reference)


def _launch(overrides, run_dir: Path, backend: str, **extra: object) -> None:  # noqa: ANN001
    if backend == "single":  # one process: the experts' layout without expert parallelism
        args = run_args(overrides, run_dir, **REFERENCE_EXTRA, **NO_SURGERY, **extra)
        assert_ok(run_ats_train(args, nproc=None))
    else:
        assert_ok(run_ats_train(_args(overrides, run_dir, backend, **extra), nproc=2))


@pytest.fixture(scope="module")
def saved_at_step_4(overrides, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    """saved_at_step_4(backend) -> the run dir of a 4-step run on that layout, made once and
    resumed (copied) by every test that continues it."""
    saved: dict[str, Path] = {}

    def get(backend: str) -> Path:
        if backend not in saved:
            run_dir = tmp_path_factory.mktemp(f"saved-{backend}")
            _launch(overrides, run_dir, backend, train__steps=4)
            assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-000004"
            saved[backend] = run_dir
        return saved[backend]

    return get


@pytest.mark.parametrize(
    ("saved_with", "resumed_with"),
    [("ddp", "single"), ("single", "ddp"), ("fsdp2", "single"), ("fsdp2", "ddp"), ("ddp", "fsdp2")],
    ids=[
        "ddp-ep2-to-1",
        "ep1-to-ddp-ep2",
        "fsdp2-ep2-to-1",
        "fsdp2-ep2-to-ddp-ep2",
        "ddp-ep2-to-fsdp2-ep2",
    ],
)
def test_checkpoint_resumes_at_another_expert_parallel_size(
    saved_with: str,
    resumed_with: str,
    saved_at_step_4,  # noqa: ANN001
    single_reference: Path,
    overrides,  # noqa: ANN001
    tmp_path: Path,
) -> None:
    """Saved at step 4 with experts sharded over 2 ranks and continued by `single` (every expert
    on one rank), the reverse, and saved by fsdp2 with sharded experts and continued by ddp with
    them, and the reverse: steps 5-6 and the final weights, which need the restored Adam moments of every expert,
    match the uninterrupted single-process run. Each saved run is continued by a copy, so the
    tests that resume one saved run share it."""
    run_dir = tmp_path / "resumed"
    shutil.copytree(saved_at_step_4(saved_with), run_dir)
    _launch(overrides, run_dir, resumed_with)
    got = train_losses(run_dir)
    assert {5, 6} <= got.keys()
    _assert_same_losses(got, train_losses(single_reference))
    _assert_same_weights(run_dir, single_reference)
