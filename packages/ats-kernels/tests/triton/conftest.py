"""Triton kernel tests: CPU through TRITON_INTERPRET=1 at small shapes, CUDA under the gpu marker.

TRITON_INTERPRET must be set before triton.language and ats_kernels.triton are imported (triton.jit
reads it when a function is decorated). ../conftest.py sets it before the package's test modules
import anything; when this folder runs inside a larger session where triton was imported earlier
(e.g. the whole workspace), the in-process CPU cases skip and test_interpreter_subprocess.py runs
this folder again in a fresh process with the variable set.
"""

import importlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

HAS_TRITON = importlib.util.find_spec("triton") is not None
if not HAS_TRITON:  # e.g. macOS wheels of torch ship without triton: nothing here can run
    collect_ignore_glob = ["test_*.py"]


def _interpreter_ready() -> bool:
    """True when triton's own jit helpers (tl.sigmoid, tl.max, ...) and ours are interpreted."""
    if not HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    rms_norm_module = importlib.import_module("ats_kernels.triton.rms_norm")

    return isinstance(tl.standard.sigmoid, InterpretedFunction) and isinstance(
        rms_norm_module._rms_norm_fwd_kernel, InterpretedFunction
    )


INTERPRETER_READY = _interpreter_ready()

# relative tolerance per dtype; absolute tolerance is the same times the largest expected value
TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@pytest.fixture(
    params=[
        pytest.param("cpu", id="interp"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]
)
def device(request: pytest.FixtureRequest) -> str:
    """Device of a test: cpu runs kernels in Triton's interpreter, cuda compiles them."""
    if request.param == "cpu" and not INTERPRETER_READY:
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 (or it is unset): "
            "test_interpreter_subprocess.py runs the CPU cases in a fresh process"
        )
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return request.param


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, what: str, tol: float | None = None
) -> None:
    """Compare in fp32 with the dtype's tolerance scaled by the largest expected magnitude."""
    rtol = TOL[expected.dtype] if tol is None else tol
    scale = max(1.0, float(expected.detach().float().abs().max())) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual.detach().float(),
        expected.detach().float(),
        rtol=rtol,
        atol=rtol * scale,
        msg=lambda m: f"{what}: {m}",
    )


@pytest.fixture
def close():
    """The assert_close above, as a fixture (test modules cannot import conftest by name)."""
    return assert_close


@pytest.fixture
def interpreter_ready() -> bool:
    """Whether the CPU cases could run in this process (see the module docstring)."""
    return INTERPRETER_READY


def _expect_input_error(device: str, match: str, code: str) -> None:
    """Run `code` (a statement defining nothing, using `torch` and `device`) and expect a bad-input
    error whose message matches `match`.

    Checks that would stall the stream are device-side asserts on CUDA (launch.check_on_device):
    they poison the CUDA context, so the cuda case runs in a fresh process that must die with the
    message; on CPU the same call raises ValueError here.
    """
    if device == "cpu":
        with pytest.raises(ValueError, match=match):
            exec(code, {"torch": torch, "device": device})
        return
    program = f"import torch\ndevice = {device!r}\n{code}\ntorch.cuda.synchronize()\n"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert run.returncode != 0, "the bad input was accepted"
    assert re.search(match, run.stderr), run.stderr[-2000:]


@pytest.fixture
def expect_input_error():
    """_expect_input_error above, as a fixture."""
    return _expect_input_error
