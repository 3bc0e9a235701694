"""Build DeepSpeed's C++ ops ahead of their first use:
`uv run python -m ats_train.backends.deepspeed_ops`.

DeepSpeed compiles the ops the deepspeed backend uses (CPU Adam for optimizer offload, async I/O
and pinned memory for NVMe offload, the shared-memory all-reduce of its CPU accelerator) with
torch's JIT extension builder the first time a process needs them, into TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions). The build is keyed by the virtual environment's paths, so
every new environment pays it once: minutes on a 2-core machine, charged to whichever training run
or test happens to load an op first. This builds them once after `uv sync` (.ci/run does), and
prints what it built; an op the machine cannot build (async I/O without libaio) is reported and
the command exits 1, since the backend's NVMe offload would fail the same way later.
"""

from __future__ import annotations

import sys
import time

# the builders the deepspeed backend loads, by DeepSpeed's class names
OPS = ("CPUAdamBuilder", "AsyncIOBuilder", "PinMemoryBuilder", "ShareMemCommBuilder")


def build_all() -> list[str]:
    """Load (building where needed) every op of OPS the current accelerator provides; returns the
    names that could not be built, each with why."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    failed = []
    for name in OPS:
        builder = accelerator.create_op_builder(name)
        if builder is None:
            print(f"{name}: not used by the {accelerator.device_name()} accelerator", flush=True)
            continue
        if not builder.is_compatible(verbose=False):
            failed.append(f"{name}: not buildable here (DeepSpeed's compatibility check failed; "
                          "for async I/O install libaio's headers, Debian: libaio-dev)")  # fmt: skip
            continue
        start = time.perf_counter()
        builder.load(verbose=False)
        print(f"{builder.name}: ready ({time.perf_counter() - start:.0f} s)", flush=True)
    return failed


def main() -> int:
    failed = build_all()
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
