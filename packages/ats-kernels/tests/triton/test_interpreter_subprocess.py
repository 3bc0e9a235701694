"""Runs this folder's CPU (interpreter) cases in a fresh process when this one imported triton
before TRITON_INTERPRET=1 could take effect (a whole-workspace pytest run does). Slow: the quick
tier `-m "not slow"` of the whole workspace leaves the interpreted cases out; run alone
(`uv run pytest packages/ats-kernels`) they run in process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.mark.slow  # every kernel case interpreted again: the quick tier's largest item (91 s loaded)
def test_cpu_cases_in_fresh_process(interpreter_ready: bool) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the kernels are compiled, not interpreted")
    if interpreter_ready:
        pytest.skip("the CPU cases ran in this process")
    folder = Path(__file__).parent
    repo_root = folder.parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(folder), "-q", "-p", "no:cacheprovider"],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert " passed" in proc.stdout
