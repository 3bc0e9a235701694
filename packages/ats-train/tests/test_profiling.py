"""Step profiling: the interval arithmetic and categories against hand-computed answers, and a real
CLI run whose profile window holds exactly the steps asked for."""

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from ats_train.cli import main
from ats_train.config import ConfigError, load_config
from ats_train.profiling import busy_time, category, summarize
from torch.autograd import DeviceType


def test_busy_time_is_the_union_of_kernel_intervals() -> None:
    # [0, 10) and [5, 12) overlap (a compute and an NCCL stream): 12; [20, 21) and a nested
    # [20.2, 20.5) add 1; a kernel ending exactly where another starts is not double counted
    assert busy_time([(5, 12), (0, 10), (20, 21), (20.2, 20.5), (21, 23)]) == 12 + 3
    assert busy_time([]) == 0.0


@pytest.mark.parametrize(
    ("kernel", "expected"),
    [
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
        ("nvjet_hsh_192x192_64x4_2x1_v_bz_coopA_TNT", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("Memcpy DtoH (Device -> Pinned)", "copy/fill"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "triton"),
        ("_rms_norm_fwd_kernel", "triton"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>", "other"),
    ],
)
def test_kernel_categories(kernel: str, expected: str) -> None:
    assert category(kernel) == expected


def _event(name: str, start: float, end: float, *, device: bool = True, annotation: bool = False):
    """A stand-in for torch.autograd.profiler_util.FunctionEvent with the fields summarize reads."""
    return SimpleNamespace(
        name=name,
        device_type=DeviceType.CUDA if device else DeviceType.CPU,
        is_user_annotation=annotation,
        time_range=SimpleNamespace(start=start, end=end),
        self_cpu_time_total=0.0 if device else end - start,
    )


def test_summary_per_step_without_annotation_ranges() -> None:
    events = [  # two steps, microseconds; the annotation spans a gap and must not count
        _event("nvjet_sm90_tst_256x128", 0, 600),
        _event("ncclDevKernel_AllGather_RING_LL", 400, 1000),
        _event("nccl:_all_gather_base", 0, 3000, annotation=True),
        _event("_rms_norm_fwd_kernel", 2000, 2400),
        _event("aten::mm", 0, 800, device=False),
    ]
    summary = summarize(events, steps=2, wall_s=0.004)
    assert summary["wall_ms_per_step"] == 2.0
    assert summary["gpu_busy_ms_per_step"] == (1000 + 400) / 1e3 / 2
    assert summary["gpu_idle_fraction"] == 1 - 0.7 / 2.0
    assert summary["kernels_per_step"] == 1.5
    assert summary["gpu_ms_per_step_by_category"] == {
        "communication": 0.3, "matmul": 0.3, "triton": 0.2
    }  # fmt: skip
    assert summary["top_host_ops"] == [{"name": "aten::mm", "self_ms_per_step": 0.4}]
    # the GPU idles over [1000, 2000): aten::mm covers none of it
    assert summary["gpu_idle_ms_per_step"] == 0.5
    assert summary["host_during_gpu_idle"] == []


def test_host_ops_are_charged_with_the_gpu_idle_time_they_overlap() -> None:
    events = [  # kernels leave two gaps: [100, 300) and [400, 1000)
        _event("k1", 0, 100),
        _event("k2", 300, 400),
        _event("k3", 1000, 1100),
        _event("Optimizer.step#AdamW.step", 350, 900, device=False),  # 500 of the second gap
        _event("aten::_fused_adamw_", 500, 700, device=False),  # nested, inside it: 200
        _event("aten::mm", 50, 150, device=False),  # 50 of the first gap
        _event("aten::mm", 250, 420, device=False),  # 50 + 20
    ]
    summary = summarize(events, steps=1, wall_s=0.0011)
    assert summary["gpu_idle_ms_per_step"] == 0.8
    assert summary["host_during_gpu_idle"] == [
        {"name": "Optimizer.step#AdamW.step", "ms_per_step": 0.5},
        {"name": "aten::_fused_adamw_", "ms_per_step": 0.2},
        {"name": "aten::mm", "ms_per_step": 0.12},
    ]


def test_profile_section_rejects_negative_values() -> None:
    with pytest.raises(ConfigError, match="profile.steps = -1"):
        load_config(None, ["profile.steps=-1"])
    with pytest.raises(ConfigError, match="profile.start = -2"):
        load_config(None, ["profile.start=-2"])


def test_cli_run_writes_a_trace_and_summary_of_the_window(tmp_path: Path, overrides) -> None:
    run = tmp_path / "run"
    assert main(["--run-dir", str(run), *overrides(profile__start=2, profile__steps=3)]) == 0
    out = run / "profile" / "rank-0"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    # CPU run: no kernels; the host ops are the model's own (the matmuls of every linear layer)
    assert summary["gpu_busy_ms_per_step"] == 0.0 and summary["kernels_per_step"] == 0
    host = {op["name"] for op in summary["top_host_ops"]}
    assert {"aten::mm", "aten::addmm", "aten::bmm"} & host
    assert summary["wall_ms_per_step"] > 0
    assert "top host ops" in (out / "summary.txt").read_text()
    trace = json.loads(gzip.decompress((out / "trace.json.gz").read_bytes()))
    # the window holds exactly three optimizer steps
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("Optimizer.step#")]
    assert len(steps) == 3


def test_profile_off_writes_nothing(tmp_path: Path, overrides) -> None:
    run = tmp_path / "run"
    assert main(["--run-dir", str(run), *overrides(train__steps=2)]) == 0
    assert not (run / "profile").exists()
