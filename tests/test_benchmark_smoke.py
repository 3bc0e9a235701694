"""Benchmark scripts' CPU smoke modes, end to end in a subprocess: what the real run will print is
checked for shape and for facts computable by hand (parameter counts, one eval set)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
def test_nanogpt_race_smoke(tmp_path):
    out = tmp_path / "race.json"
    result = run_script("benchmarks/nanogpt_race.py", "--smoke", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["results"]}
    assert list(rows) == ["nanogpt", "ats_dense", "ats_moe", "ats_hybrid"]
    # one held-out set for all: the same val tokens, hashed
    assert len({r["eval_sha256"] for r in rows.values()}) == 1
    for r in rows.values():
        assert r["steps"] >= 3 and math.isfinite(r["final_val_loss"])
        assert r["final_val_loss"] == r["curve"][-1][2]
        assert [t for t, _, _ in r["curve"]] == sorted(t for t, _, _ in r["curve"])
    # nanoGPT 2 x 64 wide, 4 heads, vocab 512, block 32, no biases: wte + wpe + 2 blocks + ln_f
    block = 64 + 64 * 3 * 64 + 64 * 64 + 64 + 64 * 256 + 256 * 64
    assert rows["nanogpt"]["params"] == 512 * 64 + 32 * 64 + 2 * block + 64
    assert rows["ats_dense"]["params"] == rows["ats_dense"]["active_params"]
    assert rows["ats_moe"]["active_params"] < rows["ats_moe"]["params"]
    assert set(report["summary"]) == {
        "ats_dense_time_to_nanogpt_final_s",
        "nanogpt_train_s",
        "moe_minus_dense_nats",
        "hybrid_minus_dense_nats",
    }


@pytest.mark.slow
def test_fp8_smoke_runs_bf16_and_records_the_fp8_refusal(tmp_path):
    out = tmp_path / "fp8.json"
    result = run_script("benchmarks/fp8.py", "--smoke", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == [
        "tiny-dense_bf16",
        "tiny-dense_fp8_tensorwise",
        "tiny-dense_fp8_rowwise",
    ]
    assert rows[0]["tokens_per_s"] > 0 and math.isfinite(rows[0]["val_loss"])
    assert len(rows[0]["loss_curve"]) == 4
    for r in rows[1:]:
        assert "needs a CUDA GPU with FP8 tensor cores" in r["error"]


@pytest.mark.slow
def test_mod_isoflops_smoke_spends_equal_flops(tmp_path):
    out = tmp_path / "mod.json"
    result = run_script("benchmarks/mod_isoflops.py", "--smoke", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    dense, mod = report["rows"]
    assert (dense["name"], mod["name"]) == ("tiny-dense", "tiny-mod")
    # MoD buys more steps with the same FLOPs: within one step's worth of dense's budget
    assert mod["steps"] > dense["steps"]
    assert abs(mod["train_flops"] - dense["train_flops"]) <= mod["train_flops"] / mod["steps"]
    assert math.isfinite(mod["val_loss_causal_routing"]) and "val_loss_causal_routing" not in dense
    for row in (dense, mod):  # where each leg's time went
        assert set(row["phases_s"]) == {"build", "warmup_compile", "timed_steps", "eval"}
        assert row["phases_s"]["timed_steps"] <= row["train_wall_s"]
    assert set(report["summary"]) == {
        "mod_steps_per_s_ratio",
        "mod_train_wall_ratio",
        "val_gap_topk",
        "val_gap_causal_routing",
    }


@pytest.mark.slow
def test_packed_stream_builds_and_reports_every_case(tmp_path):
    """benchmarks/packed_stream.py compiles the runtime's kernel sources with its loop and reports
    one line per (set, precision, rows); the scalar set runs on every machine."""
    result = run_script("benchmarks/packed_stream.py", "--kernels", "scalar", "--reps", "2",
                        "--stream-mb", "2", "--cache", str(tmp_path))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    names = [f"packed-stream/scalar/int{b}/rows{n}" for b in (4, 8) for n in (1, 8)]
    assert [r["name"] for r in rows] == names
    for r in rows:
        assert len(r["in_cache_gmac_s"]) == len(r["streamed_gmac_s"]) == 2
        assert min(r["in_cache_gmac_s"] + r["streamed_gmac_s"]) > 0 and r["ratio"] > 0
    bad = run_script("benchmarks/packed_stream.py", "--kernels", "sse", "--reps", "1",
                     "--stream-mb", "1", "--cache", str(tmp_path))  # fmt: skip
    assert bad.returncode != 0 and "kernels 'sse' is unknown" in bad.stderr
