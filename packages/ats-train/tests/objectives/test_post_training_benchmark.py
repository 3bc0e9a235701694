"""benchmarks/post_training.py --smoke runs the whole pipeline on CPU (pretrain -> SFT -> GRPO,
DPO) and reports every number; the accuracy goals are for its --device cuda scale."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.slow
def test_smoke_pipeline_reports_every_number(tmp_path: Path) -> None:
    work = tmp_path / "bench"
    script = ROOT / "benchmarks" / "post_training.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--work", str(work)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((work / "report.json").read_text())
    assert set(report["exact_match"]) == {"pretrained", "sft", "grpo", "dpo"}
    assert all(0.0 <= v <= 1.0 for v in report["exact_match"].values())
    assert 0.0 <= report["dpo_heldout_preference_accuracy"] <= 1.0
    packing = report["sft_packing"]
    assert packing["packed"]["rows"] < packing["padded"]["rows"]  # several examples per row
    assert all(packing[k]["real_tokens_per_s"] > 0 for k in ("packed", "padded"))
    for stage in ("sft", "grpo", "dpo"):
        assert (work / stage / "model" / "model.safetensors").is_file()
