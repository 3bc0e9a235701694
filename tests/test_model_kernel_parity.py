"""The whole model on the Triton kernel set (Triton's CPU interpreter here, compiled on a GPU)
against the reference kernel set: the same loss and gradients for a dense and a MoE+MoD preset, so
every kernel is checked where the model calls it (layouts, dtypes, the fused residual + RMSNorm),
in fp32 and under bf16 autocast with a bf16 residual stream."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("model_kernel_parity.py")


# (loss rel, max gradient rel err): fp32 kernels reduce in other orders than torch (~1e-6); in bf16
# one rounding flip in a norm output moves a gradient by ~2^-8 relative
TOLERANCE = {"fp32": (1e-5, 1e-4), "bf16-stream": (1e-3, 6e-2)}


PRESETS = ("tiny-dense", "tiny-hybrid")


@pytest.fixture(scope="module")
def parity() -> dict[tuple[str, str], dict]:
    """(preset, mode) -> model_kernel_parity.py's result, every case in one fresh process."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = {**os.environ}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # set before the fresh process imports triton
    cases = [f"{preset}:{mode}" for preset in PRESETS for mode in TOLERANCE]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), device, *cases],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(cases) :]]
    return {(r["preset"], r["mode"]): r for r in results}


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(TOLERANCE))
@pytest.mark.parametrize("preset", PRESETS)
def test_triton_kernel_set_matches_reference(preset: str, mode: str, parity: dict) -> None:
    result = parity[preset, mode]
    loss_rel, grad_rel = TOLERANCE[mode]
    assert result["triton_loss"] == pytest.approx(result["loss"], rel=loss_rel)
    assert result["max_grad_rel_err"] < grad_rel, result
