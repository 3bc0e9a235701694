"""Every Triton kernel compiles for sm_90 (the H200), checked on any machine with triton's ptxas."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_kernels_compile_for_sm90() -> None:
    script = Path(__file__).with_name("sm90_compile_check.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
