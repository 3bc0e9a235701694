"""The native runtime's packed integer kernels (dot_q4_packed / dot_q8_packed, kernels.h) on one
thread: multiply-adds per second with the weights in cache against the same kernel streaming them
from DRAM, at 1 and 8 activation rows per call (a decoding step of 1 and of 8 sequences reads
every weight once). The gap at 8 rows is what the kernels' prefetch (kernels_x86.h) closes.

Compiles benchmarks/packed_stream/loop.cpp with the kernel sources of --native (default: this
checkout's native/; another checkout's, e.g. `git worktree add /tmp/old REV`, to compare) with g++
-O3, as the runtime's Release build does. Per kernel set, precision and rows: --reps rounds, each an
in-cache run (4 row groups, 37-66 KB, swept for about a second) then a streamed one (--stream-mb,
default 256 MB, far past the caches; 3 sweeps). Prints one JSON line each: {"name", "in_cache_gmac_s", "streamed_gmac_s",
"streamed_gb_s", "ratio" (median streamed / median in cache), "hardware"}.

Run: uv run --no-sync python benchmarks/packed_stream.py [--kernels avx512 avx2] [--reps 3]
"""

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("kernels.cpp", "kernels_scalar.cpp", "kernels_avx2.cpp", "kernels_avx512.cpp",
           "kernels_neon.cpp")  # fmt: skip
N_BLOCKS = 32  # K = 1024 inputs per weight row, dense-254m's attention and w1/w3 width


def build(native: Path, cache: Path) -> Path:
    """The loop binary for the kernel sources of `native`, cached by their content."""
    runtime = native / "src" / "runtime"
    files = [HERE / "packed_stream" / "loop.cpp"] + [runtime / name for name in SOURCES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"--native {native}: missing {', '.join(missing)}")
    digest = hashlib.sha256()
    for f in [*files, *sorted(runtime.glob("*.h"))]:
        digest.update(f.read_bytes())
    binary = cache / f"packed-stream-{digest.hexdigest()[:16]}"
    if not binary.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        command = ["g++", "-O3", "-DNDEBUG", "-std=c++17", f"-I{runtime}",
                   f"-I{native / 'include'}", *map(str, files), "-o", str(binary)]  # fmt: skip
        subprocess.run(command, check=True)
    return binary


def run(binary: Path, kernels: str, bits: int, nx: int, groups: int, sweeps: int) -> tuple:
    args = [str(binary), kernels, str(bits), str(nx), str(groups), str(sweeps), str(N_BLOCKS)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{kernels}: {done.stderr.strip()}")
    gmac, gb = map(float, done.stdout.split())
    return gmac, gb


def hardware() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, 1 thread"
    return "unknown CPU, 1 thread"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--native", type=Path, default=HERE.parent / "native")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "ats-bench")
    parser.add_argument("--kernels", nargs="+", default=["avx512", "avx2"])
    parser.add_argument("--bits", nargs="+", type=int, choices=(4, 8), default=[4, 8])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--stream-mb", type=int, default=256, help="weights of the streamed runs")
    args = parser.parse_args()
    binary = build(args.native.resolve(), args.cache)
    for kernels in args.kernels:
        for bits in args.bits:
            group_bytes = 288 * N_BLOCKS if bits == 4 else 64 + 512 * N_BLOCKS
            for nx in args.rows:
                small = run(binary, kernels, bits, nx, 4, 100)
                # about a second in cache at the rate just measured
                sweeps = max(1, int(small[1] * 1e9 / (4 * group_bytes)))
                cached, streamed = [], []
                for _ in range(args.reps):
                    cached.append(run(binary, kernels, bits, nx, 4, sweeps))
                    groups = max(1, (args.stream_mb << 20) // group_bytes)
                    streamed.append(run(binary, kernels, bits, nx, groups, 3))
                in_cache = [round(g, 1) for g, _ in cached]
                stream = [round(g, 1) for g, _ in streamed]
                print(json.dumps({"name": f"packed-stream/{kernels}/int{bits}/rows{nx}",
                                  "in_cache_gmac_s": in_cache, "streamed_gmac_s": stream,
                                  "streamed_gb_s": [round(b, 2) for _, b in streamed],
                                  "ratio": round(statistics.median(stream)
                                                 / statistics.median(in_cache), 3),
                                  "hardware": hardware()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
