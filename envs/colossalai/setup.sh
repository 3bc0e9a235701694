#!/usr/bin/env bash
# Builds envs/colossalai/.venv, the isolated environment of parallel.backend = "colossalai":
# torch 2.5.1 + colossalai 0.5.0 from this folder's own uv.lock (not the workspace lock), then the
# ats packages from the workspace paths, editable and --no-deps: their metadata says torch >= 2.11,
# so here they run on torch 2.5.1 outside their declared range (envs/colossalai/README.md).
# Needs PyPI (about 3 GB of wheels: torch's CUDA build and the nvidia-* libraries); ~6 GB on disk.
set -euo pipefail
cd "$(dirname "$0")"

uv sync --locked
uv pip install --python .venv/bin/python --no-deps \
    -e ../../packages/ats-tokenizer \
    -e ../../packages/ats-kernels \
    -e ../../packages/ats-model \
    -e ../../packages/ats-data \
    -e ../../packages/ats-train
.venv/bin/python -c "import torch, colossalai, ats_train; \
print(f'envs/colossalai: torch {torch.__version__}, colossalai {colossalai.__version__}')"
