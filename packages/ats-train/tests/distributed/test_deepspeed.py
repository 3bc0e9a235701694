"""deepspeed on 2 real gloo ranks (torchrun; DeepSpeed's CPU accelerator falls back to torch's gloo
without oneCCL, deepspeed/accelerator/cpu_accelerator.py) against the single-process run: ZeRO-2
for 6 steps, ZeRO-1 for 4 steps then resumed on 1 rank (single) and on 2 (ZeRO-3 with CPU offload),
so stages 1, 2, 3 and offload each reproduce the loss curve; ZeRO-2 with DeepSpeed's own sharded
checkpoint saved and resumed on 2 ranks, refused on 1; ZeRO-3 with every parameter on NVMe against
parameters in host RAM, bit for bit (on a GPU also with the optimizer not offloaded). DeepSpeed
launches take ~30-60 s each on 2 cores (the refused one ~15 s), so the other combinations (ZeRO-3
without offload saved and resumed, full and sharded) were run by hand.

Tolerance as for ddp/fsdp2 (test_backends.py): 1e-5 relative per step on the fp32 train loss, 1e-5
absolute on final weights; same global batch, data and init, only the order of fp32 additions in
the reduce-scatter differs. Measured (6 steps): <= 5e-8 relative on the loss, 2e-7 on weights; with
DeepSpeedCPUAdam (offload) also 2e-8 on the loss.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ats_model import load_pretrained
from ats_train_torchrun import (
    STEPS,
    assert_ok,
    model_weights,
    run_args,
    run_ats_train,
    run_ats_train_deepspeed_launcher,
    train_losses,
)
from safetensors.torch import load_file

pytestmark = [pytest.mark.dist, pytest.mark.slow]

LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5


def _assert_same_losses(got: dict[int, float], want: dict[int, float]) -> None:
    assert got.keys() <= want.keys() and got
    for step, loss in got.items():
        assert loss == pytest.approx(want[step], rel=LOSS_RTOL), f"step {step}"


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype == torch.float32, name
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=WEIGHT_ATOL, msg=name)


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {
        p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()
    }


def _assert_reproduces(run_dir: Path, reference: Path) -> None:
    """Every step's loss and the final weights are the uninterrupted single-process run's."""
    want, got = train_losses(reference), train_losses(run_dir)
    assert got.keys() == want.keys() == set(range(1, STEPS + 1))
    _assert_same_losses(got, want)
    _assert_same_weights(model_weights(run_dir), model_weights(reference))


def test_zero2_on_two_ranks_reproduces_the_single_process_run(
    single_reference: Path,
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """Global batch 4: single runs 4 micro-batches of 1, each rank 2 with accumulation."""
    zero2 = {"parallel__backend": "deepspeed", "parallel__deepspeed__zero_stage": 2}
    assert_ok(run_ats_train(run_args(overrides, tmp_path, **zero2), 2))
    _assert_reproduces(tmp_path, single_reference)


def test_deepspeed_launcher_runs_zero1_like_torchrun(
    single_reference: Path,
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """The README's second way to start ranks: DeepSpeed's launcher, 2 CPU ranks, ZeRO-1; the loss
    curve and the final weights are the single-process run's, as under torchrun."""
    zero1 = {"parallel__backend": "deepspeed", "parallel__deepspeed__zero_stage": 1}
    proc = run_ats_train_deepspeed_launcher(run_args(overrides, tmp_path, **zero1), 2)
    assert_ok(proc)
    assert (proc.stdout + proc.stderr).count("exits successfully") == 2  # the launcher's 2 ranks
    _assert_reproduces(tmp_path, single_reference)


def test_zero1_checkpoint_resumes_on_one_rank_and_on_two_with_zero3_offload(
    single_reference: Path,
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """ZeRO-1 on 2 ranks to step 4 (matching the reference), continued to step 6 by `single` on 1
    rank and by ZeRO-3 with optimizer and parameter offload to the CPU on 2 ranks (DeepSpeedCPUAdam,
    JIT-built with g++/ninja on first use): steps 5 and 6 and the final weights, which need the
    restored Adam moments, match the uninterrupted single-process run. The model directories are
    plain ATS model directories (ats_model.load_pretrained)."""
    saved = tmp_path / "saved"
    zero1 = {"parallel__backend": "deepspeed", "parallel__deepspeed__zero_stage": 1}
    assert_ok(run_ats_train(run_args(overrides, saved, train__steps=4, **zero1), 2))
    assert (saved / "checkpoints" / "latest").read_text().strip() == "step-000004"
    want = train_losses(single_reference)
    _assert_same_losses(train_losses(saved), want)
    model = load_pretrained(saved / "model", kernels="reference")
    reference_step4 = load_file(
        str(single_reference / "checkpoints" / "step-000004" / "model.safetensors")
    )
    _assert_same_weights(dict(model.state_dict()), reference_step4)
    zero3_offload = {
        "parallel__backend": "deepspeed",
        "parallel__deepspeed__zero_stage": 3,
        "parallel__deepspeed__offload_optimizer": "cpu",
        "parallel__deepspeed__offload_param": "cpu",
    }
    for name, extra, nproc in (("on1", {}, None), ("on2", zero3_offload, 2)):
        run_dir = tmp_path / name
        shutil.copytree(saved, run_dir)
        assert_ok(run_ats_train(run_args(overrides, run_dir, **extra), nproc))
        got = train_losses(run_dir)
        assert {5, 6} <= got.keys()
        _assert_same_losses(got, want)
        _assert_same_weights(model_weights(run_dir), model_weights(single_reference))


def test_zero2_sharded_checkpoint_resumes_only_at_the_saved_world_size(
    single_reference: Path,
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """checkpoint.format = sharded: ZeRO-2 on 2 ranks writes DeepSpeed's own files (each rank its
    partition of the fp32 masters and Adam moments, nothing gathered) at step 4; ZeRO-2 on 2 ranks
    continues to step 6 matching the uninterrupted single-process run. On 1 rank (deepspeed, or
    single) the run stops before writing anything, with an error naming both layouts."""
    saved = tmp_path / "saved"
    zero2 = {
        "parallel__backend": "deepspeed",
        "parallel__deepspeed__zero_stage": 2,
        "checkpoint__format": "sharded",
    }
    assert_ok(run_ats_train(run_args(overrides, saved, train__steps=4, **zero2), 2))
    step4 = saved / "checkpoints" / "step-000004"
    files = json.loads((step4 / "manifest.json").read_text())["files"]
    shards = [
        f"trainer_state/deepspeed/zero/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)
    ]
    assert set(shards) <= files.keys()
    assert "trainer_state/optimizer.json" not in files
    # the model directory is still a plain ATS model directory, equal to the reference's at step 4
    model = load_pretrained(step4, kernels="reference")
    reference_step4 = load_file(
        str(single_reference / "checkpoints" / "step-000004" / "model.safetensors")
    )
    _assert_same_weights(dict(model.state_dict()), reference_step4)
    run_dir = tmp_path / "on2"
    shutil.copytree(saved, run_dir)
    assert_ok(run_ats_train(run_args(overrides, run_dir, **zero2), 2))
    got, want = train_losses(run_dir), train_losses(single_reference)
    assert {5, 6} <= got.keys()
    _assert_same_losses(got, want)
    _assert_same_weights(model_weights(run_dir), model_weights(single_reference))
    before = _snapshot(saved)
    for parallel, nproc, here in (
        (zero2, 1, "deepspeed on 1 rank(s), ZeRO stage 2"),
        # the deepspeed table is refused without its backend: only the backend changes
        ({"parallel__backend": "single"}, None, "single on 1 rank(s)"),
    ):
        proc = run_ats_train(run_args(overrides, saved, **parallel), nproc)
        assert proc.returncode != 0
        # the CLI's one-line error (under torchrun followed by torchrun's own report)
        saved_layout = "written by deepspeed on 2 rank(s), ZeRO stage 2"
        lines = [line for line in proc.stderr.splitlines() if saved_layout in line]
        assert lines and lines[0].startswith("ats-train train: error: "), proc.stderr[-2000:]
        assert f"this run is {here}" in lines[0]
        assert _snapshot(saved) == before


def test_zero3_releasing_every_parameter_trains_an_untied_head_with_the_fused_loss(
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """ZeRO-3 with nothing persistent (stage3_param_persistence_threshold 0, as a large model's
    head is): the fused loss reads the untied head's weight in the root's forward, so its backward
    needs the root's pre-backward re-gather. DeepSpeed attaches that hook to the root's output
    tensors, which it finds only in tuples, lists, dicts and namedtuples; ModelOutput was a
    dataclass and the backward met an empty weight (`The size of tensor a (0) must match`). 2
    ranks reproduce the single-process run of the same untied model."""
    untied = {"model__tie_embeddings": "false", "checkpoint__every": 0}
    reference = tmp_path / "single"
    assert_ok(run_ats_train(run_args(overrides, reference, **untied), nproc=None))
    config = tmp_path / "zero3.json"
    config.write_text(
        json.dumps(
            {
                "train_batch_size": "auto",
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            }
        )
    )
    zero3 = {**untied, "parallel__backend": "deepspeed", "parallel__deepspeed__config": config}
    run_dir = tmp_path / "zero3"
    assert_ok(run_ats_train(run_args(overrides, run_dir, **zero3), 2))
    _assert_reproduces(run_dir, reference)


# the tiny MoE+MoD model at 512 wide, so that expert and FFN partitions reach DeepSpeed's 1 MiB
# swap threshold (smaller ones stay in host RAM); untied head, fused loss, bf16 (DeepSpeed's CPU
# accelerator swaps bf16 whatever the run's precision)
NVME_ZERO3 = {
    "model__dim": 512,
    "model__ffn_dim": 1024,
    "model__tie_embeddings": "false",
    "train__precision": "bf16",
    "checkpoint__every": 0,
    "parallel__backend": "deepspeed",
    "parallel__deepspeed__zero_stage": 3,
}


def _skip_without_async_io() -> None:
    """Checked in the test, not at collection: the probe imports DeepSpeed and compiles. Without
    DeepSpeed installed the test skips, as every other DeepSpeed test here does."""
    pytest.importorskip("deepspeed")
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible(verbose=False):  # compiles a probe against libaio
        pytest.skip("libaio (Debian: libaio-dev) missing: DeepSpeed's async I/O op cannot build")


def _assert_parameters_on_nvme_changed_nothing(
    run_dir: Path, reference: Path, nvme: Path, ranks: int
) -> None:
    """Bit for bit the reference's losses and final weights, and one swap file per rank for each
    parameter whose bf16 partition reaches 1 MiB: the run read its parameters from disk."""
    assert train_losses(run_dir) == train_losses(reference)
    assert len(train_losses(run_dir)) == STEPS
    want = model_weights(reference)
    got = model_weights(run_dir)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    swapped = list(nvme.rglob("*.swp"))
    swappable = [n for n, w in want.items() if -(-w.numel() // ranks) * 2 >= 2**20]
    assert len(swapped) == ranks * len(swappable) > 0, (sorted(map(str, swapped)), swappable)


def test_zero3_with_every_parameter_on_nvme_matches_parameters_in_host_ram(
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """parallel.deepspeed.offload_param = nvme on 2 gloo ranks, the generated config: every
    parameter partition on disk (max_in_cpu 0), read back through DeepSpeed's swap buffers
    whenever its module runs, in each of 12 forward/backward passes per rank (NVME_ZERO3's model).
    With DeepSpeed's default reuse distance the swapper ran out of buffers at step 2 (`Not enough
    buffers 0 for swapping 1`); with its NVMe prefetch it read a parameter into two buffers. Disk
    is only where the parameters wait: the run is the one with parameters in host RAM
    (offload_param = cpu), loss for loss and weight for weight."""
    _skip_without_async_io()
    wide = {**NVME_ZERO3, "parallel__deepspeed__offload_optimizer": "cpu"}
    in_ram = tmp_path / "param_cpu"
    assert_ok(run_ats_train(run_args(overrides, in_ram, **wide, parallel__deepspeed__offload_param="cpu"), 2))
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    on_nvme = {"parallel__deepspeed__offload_param": "nvme", "parallel__deepspeed__nvme_path": nvme}
    run_dir = tmp_path / "param_nvme"
    assert_ok(run_ats_train(run_args(overrides, run_dir, **wide, **on_nvme), 2))
    _assert_parameters_on_nvme_changed_nothing(run_dir, in_ram, nvme, ranks=2)


@pytest.mark.gpu
def test_zero3_with_parameters_on_nvme_and_the_optimizer_on_the_gpu_matches_no_offload(
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """The layout that trains the 9.42B model on one H200 with its parameters on disk
    (benchmarks/offload.py param_nvme_hbm): every parameter partition on NVMe, the optimizer not
    offloaded (DeepSpeed builds each fp32 master on the GPU from the swapped-in partition and
    writes the updated bf16 partition back to disk after each step). One CUDA rank, NVME_ZERO3's
    model, attention fixed to one SDPA kernel: the run is plain ZeRO-3 with everything on the
    GPU, loss for loss and weight for weight."""
    _skip_without_async_io()
    zero3 = {**NVME_ZERO3, "train__device": "cuda", "train__sdpa_backend": "math"}
    on_gpu = tmp_path / "on_gpu"
    assert_ok(run_ats_train(run_args(overrides, on_gpu, **zero3), 1))
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    run_dir = tmp_path / "param_nvme"
    on_nvme = {"parallel__deepspeed__offload_param": "nvme", "parallel__deepspeed__nvme_path": nvme}
    assert_ok(run_ats_train(run_args(overrides, run_dir, **zero3, **on_nvme), 1))
    _assert_parameters_on_nvme_changed_nothing(run_dir, on_gpu, nvme, ranks=1)


@pytest.mark.gpu
def test_zero3_partial_offload_matches_the_whole_offload_and_resumes_on_a_gpu(
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """ZeRO-3 on one CUDA rank with half the optimizer's sub-groups kept on the GPU
    (parallel.deepspeed.offload_optimizer_ratio = 0.5: DeepSpeed steps them with a torch AdamW of
    its own) against the whole optimizer on the CPU. tiny-hybrid's two parameter groups make two
    sub-groups, the first (decayed weights) on the GPU: the warm-up's LR must reach it (DeepSpeed
    copies group 0's LR once), and the checkpoint at step 4 must hold its Adam moments for the
    resumed run to end with the same weights."""
    pytest.importorskip("deepspeed")
    zero3 = {
        "train__device": "cuda",
        "parallel__backend": "deepspeed",
        "parallel__deepspeed__zero_stage": 3,
        "parallel__deepspeed__offload_optimizer": "cpu",
    }
    whole = tmp_path / "whole"
    assert_ok(run_ats_train(run_args(overrides, whole, **zero3), 1))
    partial = tmp_path / "partial"
    split = {**zero3, "parallel__deepspeed__offload_optimizer_ratio": 0.5}
    assert_ok(run_ats_train(run_args(overrides, partial, train__steps=4, **split), 1))
    assert (partial / "checkpoints" / "latest").read_text().strip() == "step-000004"
    assert_ok(run_ats_train(run_args(overrides, partial, **split), 1))  # resumes at step 4
    want, got = train_losses(whole), train_losses(partial)
    assert got.keys() == want.keys() == set(range(1, STEPS + 1))
    _assert_same_losses(got, want)
    _assert_same_weights(model_weights(partial), model_weights(whole))


def test_world_size_that_does_not_divide_the_batch_fails_clearly(
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    args = run_args(overrides, tmp_path, parallel__backend="deepspeed", train__batch_size=3)
    proc = run_ats_train(args, nproc=2)
    assert proc.returncode != 0
    assert "train.batch_size = 3 is not divisible by the world size 2" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()
