"""CUDA decode benchmark of the native runtime (`ats_native.Model(path, device="cuda")`, a build
with ATS_CUDA=ON: native/tools/cuda_check.sh) on one GPU: batch-1 decode tokens/s of bf16, int8 and
int4 (groups of 32) weights, against ats-model's PyTorch engine (bf16: eager, and under
torch.compile with CUDA graphs) and HF transformers generate() on the HF export (bf16; "not
installed" without transformers) on the same GPU, and against the HBM roofline: weight bytes read per token / the measured device copy bandwidth (a
torch copy of 2 GiB, bytes read + written). Batched decode: aggregate tokens/s of --batch
sequences decoding together in one ats_native.Batch (prompts prefilled first, not timed), against
batch 1 and, for int8 / int4, against the same batch on the warp matmul kernel instead of the
tensor cores (ATS_CUDA_MMA=0); batch-1 decode with the decode steps' CUDA graphs against without
(ATS_CUDA_GRAPHS=0), and with the graph's kernels launched with programmatic dependent launch
against without (ATS_CUDA_PDL=0). --profile prints, for each model and weight type, the GPU
time of every kernel of a batch-1 decode step (torch.profiler's CUDA activity, which records the
kernels of ats_native's CUDA graphs too), the graph captured without PDL: under PDL a kernel
starts while its predecessor runs and its recorded time would include that wait.

Models (random-init weights, built on first use under --cache; the shapes of benchmarks/native.py):
    dense-254m   dim 1024, 16 layers, GQA 16/8 heads, SwiGLU 2816, vocab 32000
    dense-1b     dim 2048, 16 layers, GQA 32/8 heads, SwiGLU 5632, vocab 32000 (1.1B)
    moe-879m     dim 896, 12 layers, 16 experts of SwiGLU 1536, top-2: 879M total, 186M active
                 (its roofline counts every expert's bytes: a token reads only 2 of 16)
Prints one JSON line per measurement: {"name", "ours", "baseline", "ratio", "hardware", "unit"}.
Run (GPU machine): python3 benchmarks/native_cuda.py [--models dense-254m dense-1b]
"""

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

MODELS = {
    "dense-254m": dict(family="dense", dim=1024, n_layer=16, n_head=16, n_kv_head=8, ffn_dim=2816),
    "dense-1b": dict(family="dense", dim=2048, n_layer=16, n_head=32, n_kv_head=8, ffn_dim=5632),
    "moe-879m": dict(
        family="moe",
        dim=896,
        n_layer=12,
        n_head=14,
        n_kv_head=7,
        ffn_dim=1536,
        moe=dict(n_experts=16, top_k=2),
    ),
}
SCHEMES = {"bf16": None, "int8": (8, None), "int4": (4, 32)}


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def emit(name: str, ours: float, baseline: float, hw: str, unit: str = "tokens/s") -> None:
    row = {"name": name, "ours": round(ours, 2), "baseline": round(baseline, 2)}
    row.update(ratio=round(ours / baseline, 3), hardware=hw, unit=unit)
    print(json.dumps(row), flush=True)


def build(cache: Path, name: str) -> dict[str, Path]:
    """{scheme: model dir}: the bf16 model and its int8 / int4 copies, built once."""
    import torch
    from ats_infer.quantize import quantize_model_dir
    from ats_model import ModelConfig, build_model, save_pretrained

    base = cache / name
    if not base.exists():
        torch.manual_seed(0)
        fields = dict(MODELS[name], vocab_size=32000, max_seq_len=2048)
        model = build_model(ModelConfig(**fields, tie_embeddings=False), dtype=torch.bfloat16)
        save_pretrained(model, base)
    dirs = {"bf16": base}
    for scheme, args in SCHEMES.items():
        if args is not None:
            out = cache / f"{name}-{scheme}"
            if not out.exists():
                quantize_model_dir(base, out, *args)
            dirs[scheme] = out
    return dirs


def weight_bytes(model_dir: Path, bits: int | None) -> int:
    """Bytes of every tensor a decode step reads in full (all but the embedding table), as the
    GPU holds them (int4 scales as fp16: half their file size)."""
    path = model_dir / "model.safetensors"
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    total = 0
    for key, meta in header.items():
        if key == "__metadata__" or key.startswith("tok_embeddings"):
            continue
        size = meta["data_offsets"][1] - meta["data_offsets"][0]
        total += size // 2 if bits == 4 and key.endswith(".scale") else size
    return total


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (read + write) of a 2 GiB tensor, best of 10."""
    import torch

    src = torch.empty(2**30 // 2, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(12):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def set_env(**settings: str) -> None:
    """ATS_CUDA_<NAME> settings (read when a session starts); the others back to their default."""
    for name in ("GRAPHS", "PDL", "MMA"):
        os.environ[f"ATS_CUDA_{name}"] = settings.get(name.lower(), "1")


def ats_decode(model_dir: Path, prompt: list[int], n: int, reps: int, **settings: str) -> float:
    import ats_native

    set_env(**settings)
    model = ats_native.Model(str(model_dir), device="cuda")
    best = 0.0
    for _ in range(reps + 1):  # the first run warms up
        tokens = iter(model.generate(prompt, n + 1))
        next(tokens)  # prefill
        start = time.perf_counter()
        for _ in range(n):
            next(tokens)
        best = max(best, n / (time.perf_counter() - start))
    set_env()
    return best


def profile_decode(model_dir: Path, prompt: list[int], n: int) -> list[dict]:
    """The GPU kernels of n batch-1 decode steps (after a warm-up generate): per kernel name,
    calls and microseconds per step, largest first; the last row is the steps' wall time."""
    import ats_native
    import torch
    from torch.profiler import ProfilerActivity, profile

    set_env(pdl="0")
    model = ats_native.Model(str(model_dir), device="cuda")
    for _ in model.generate(prompt, n + 1):  # warm-up: captures the decode graph
        pass
    tokens = iter(model.generate(prompt, n + 1))
    next(tokens)  # prefill, not profiled
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(n):
            next(tokens)
        wall = time.perf_counter() - start
    set_env()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            kernels.setdefault(event.name.split("(")[0][:60], []).append(event.device_time)
    rows = [
        dict(kernel=k, calls_per_step=round(len(v) / n, 2), us_per_step=round(sum(v) / n, 2))
        for k, v in kernels.items()
    ]
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    return rows + [
        dict(
            kernel="(all kernels)",
            us_per_step=round(total, 2),
            wall_us_per_step=round(wall / n * 1e6, 2),
        )
    ]


def ats_batched(model_dir: Path, prompt: list[int], batch: int, n: int, **settings: str) -> float:
    import ats_native

    set_env(**settings)
    model = ats_native.Model(str(model_dir), device="cuda")
    rates = []
    for _ in range(2):  # warm-up, then the measured run
        b = ats_native.Batch(model, n_slots=batch, max_len=len(prompt) + n + 2)
        for slot in range(batch):
            b.start(slot, prompt[slot % len(prompt) :] + prompt[: slot % len(prompt)], n + 1)
        b.step(0)  # every prompt prefilled, first tokens sampled
        start = time.perf_counter()
        produced = sum(len(b.step(0)) for _ in range(n))
        rates.append(produced / (time.perf_counter() - start))
    set_env()
    return rates[-1]


def decode_rate(run, n: int, reps: int) -> float:
    """Steady decode tokens/s of run(k) (generate k new tokens, synchronized): n / (time of
    run(n + 1) - time of run(1)), the prefill and first token cancelling; best of reps after
    a warm-up (which, for a compiled model, also compiles and records its CUDA graphs)."""
    import torch

    def timed(k: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        run(k)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    best = 0.0
    for _ in range(reps + 1):
        best = max(best, n / (timed(n + 1) - timed(1)))
    return best


def torch_decode(model_dir: Path, prompt: list[int], n: int, reps: int, compiled: bool) -> float:
    """ats-model bf16 on the GPU through its KV-cache generate() (greedy), eager or under
    torch.compile(mode="reduce-overhead") (CUDA graphs). Its KVCache is preallocated, but a step
    attends over the cache sliced to the current length, so the compiled forward is dynamic in
    that length (dynamic=True) and CUDA graph trees record one graph per length, replayed on
    the later reps."""
    import torch
    from ats_model import generate, load_pretrained

    model = load_pretrained(model_dir).to(device="cuda", dtype=torch.bfloat16).eval()
    if compiled:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        model.compile(mode="reduce-overhead", dynamic=True)
    ids = torch.tensor([prompt], device="cuda")
    return decode_rate(lambda k: generate(model, ids, k, temperature=0.0), n, reps)


def hf_decode(model_dir: Path, prompt: list[int], n: int, reps: int) -> float | None:
    """HF transformers generate() (greedy, bf16, its default dynamic cache) on the HF export of
    the model; None when transformers is not installed."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return None
    import torch
    from ats_model import export_hf, load_pretrained
    from transformers import AutoModelForCausalLM

    hf_dir = model_dir.parent / f"{model_dir.name}-hf"
    if not hf_dir.exists():
        tmp = model_dir.parent / f"{model_dir.name}-hf.tmp"
        export_hf(load_pretrained(model_dir), tmp)
        os.replace(tmp, hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.bfloat16).cuda().eval()
    ids = torch.tensor([prompt], device="cuda")

    def run(k: int) -> None:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False)

    return decode_rate(run, n, reps)


BASELINES = {  # label -> tokens/s of the bf16 model dir (None: not installed)
    "torch-eager-bf16": lambda d, p, n, reps: torch_decode(d, p, n, reps, compiled=False),
    "torch-compile-bf16": lambda d, p, n, reps: torch_decode(d, p, n, reps, compiled=True),
    "hf-generate-bf16": hf_decode,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["dense-254m"])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--decode", type=int, default=64, help="decode steps measured")
    parser.add_argument("--batch", type=int, default=32, help="sequences of the batched run")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ats-bench-cuda"))
    parser.add_argument(
        "--profile", action="store_true", help="also print each decode step's kernel times"
    )
    parser.add_argument(
        "--baselines",
        nargs="*",
        choices=list(BASELINES),
        default=list(BASELINES),
        help="PyTorch baselines, measured after every model's native rows (none: skip them)",
    )
    args = parser.parse_args()

    import numpy as np
    import torch

    hw = torch.cuda.get_device_name()
    bandwidth = copy_bandwidth()
    emit("device-copy-bandwidth", bandwidth / 1e9, bandwidth / 1e9, hw, "GB/s")
    prompt = np.random.default_rng(0).integers(0, 32000, args.prompt_len).tolist()
    args.cache.mkdir(parents=True, exist_ok=True)
    rates: dict[str, dict[str, float]] = {}  # model -> scheme -> batch-1 tokens/s
    for name in args.models:
        dirs = build(args.cache, name)
        log(f"{name}: model dirs ready")
        rates[name] = {}
        for scheme, model_dir in dirs.items():
            bits = SCHEMES[scheme][0] if SCHEMES[scheme] else None
            rate = rates[name][scheme] = ats_decode(model_dir, prompt, args.decode, args.reps)
            roofline = bandwidth / weight_bytes(model_dir, bits)
            emit(f"{name}_{scheme}_decode-b1_vs_roofline", rate, roofline, hw)
            no_graphs = ats_decode(model_dir, prompt, args.decode, args.reps, graphs="0")
            emit(f"{name}_{scheme}_decode-b1-cuda-graphs_vs_no-graphs", rate, no_graphs, hw)
            no_pdl = ats_decode(model_dir, prompt, args.decode, args.reps, pdl="0")
            emit(f"{name}_{scheme}_decode-b1-pdl_vs_no-pdl", rate, no_pdl, hw)
            if args.profile:
                for row in profile_decode(model_dir, prompt, args.decode):
                    print(json.dumps({"name": f"{name}_{scheme}_decode-b1-profile", **row}))
            batched = ats_batched(model_dir, prompt, args.batch, args.decode)
            emit(f"{name}_{scheme}_decode-b{args.batch}-aggregate_vs_b1", batched, rate, hw)
            if bits is not None:
                warp = ats_batched(model_dir, prompt, args.batch, args.decode, mma="0")
                row = f"{name}_{scheme}_decode-b{args.batch}-aggregate-mma_vs_warp-kernel"
                emit(row, batched, warp, hw)
    # the baselines last: a slow compile or a failure there leaves every native row printed
    for label in args.baselines:
        for name in args.models:
            base = BASELINES[label](args.cache / name, prompt, args.decode, args.reps)
            for scheme, rate in rates[name].items():
                row = f"{name}_{scheme}_decode-b1_vs_{label}"
                if base is None:
                    note = dict(name=row, ours=round(rate, 2), baseline=None, hardware=hw)
                    print(json.dumps({**note, "note": "transformers not installed"}), flush=True)
                else:
                    emit(row, rate, base, hw)


if __name__ == "__main__":
    main()
