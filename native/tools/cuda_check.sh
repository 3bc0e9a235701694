#!/usr/bin/env bash
# Builds ats_native with the CUDA backend (cmake, ATS_CUDA=ON, sm_90) under python3's own
# nanobind, then runs the GPU parity tests (`-m gpu`) against the CPU runtime on model
# directories the tests create, prints the parity figures (native/tools/cuda_parity.py) and,
# with --bench, times each matmul kernel alone (cuda_matmul_bench, built alongside) and runs
# benchmarks/native_cuda.py. For a GPU machine
# with nvcc, cmake, ninja, python3 with torch, numpy, safetensors and pytest, and no uv:
#   bash native/tools/cuda_check.sh [--bench [native_cuda.py options]]
# Output: build log and test report under $OUT when set (the device runner), else ./cuda_check.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT:-$PWD/cuda_check}
BUILD=${ATS_CUDA_BUILD:-/tmp/ats_cuda_build}
mkdir -p "$OUT_DIR"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

cmake -S native -B "$BUILD" -G Ninja -DATS_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$(command -v python3)" >"$OUT_DIR/build.log" 2>&1 \
    && cmake --build "$BUILD" -j "$(nproc)" >>"$OUT_DIR/build.log" 2>&1 \
    || { tail -40 "$OUT_DIR/build.log"; exit 1; }

# the package as the wheel lays it out: python/ats_native + the built extension
PKG=$BUILD/pkg
rm -rf "$PKG" && mkdir -p "$PKG/ats_native"
cp native/python/ats_native/* "$PKG/ats_native/"
cp "$BUILD"/_ats_native*.so "$PKG/ats_native/"
export PYTHONPATH=$PKG:$(ls -d packages/*/src | paste -sd:)${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import ats_native; assert ats_native.cuda_built(); print("ats_native", ats_native.version(), "cuda_built")'

status=0
python3 -m pytest -m gpu -q -p no:cacheprovider native/tests/runtime/test_cuda.py \
    packages/ats-infer/tests/test_native_engine.py 2>&1 | tee "$OUT_DIR/tests.log" || status=1
PYTHONUNBUFFERED=1 python3 native/tools/cuda_parity.py 2>&1 | tee "$OUT_DIR/parity.jsonl" || status=1

if [ "${1:-}" = "--bench" ]; then
    shift
    "$BUILD/cuda_matmul_bench" 2>&1 | tee "$OUT_DIR/matmul_bench.jsonl" || status=1
    PYTHONUNBUFFERED=1 python3 benchmarks/native_cuda.py "$@" 2>&1 | tee "$OUT_DIR/bench.jsonl"
fi
exit $status
