"""ats-kernels benchmark on one CUDA GPU: every Triton op forward + backward against baselines
measured in the same run (PyTorch eager reference, torch.compile of it, F.rms_norm, Liger-Kernel
when importable, an HF-style loop-over-experts MoE block, torch._grouped_mm, a dense SwiGLU MLP).

First the device's own ceilings: copy bandwidth (device-to-device copy, bytes read + written / time)
and bf16 matmul TFLOP/s. Times are triton.testing.do_bench medians of forward + backward (the
backward through torch.autograd.grad, so nothing accumulates); every input is far larger than L2,
so no rotation is needed. Prints one JSON line per measurement:
  {"name", "ours", "baseline", "ratio", "ratio_is", "hardware", "unit", ...}
ratio_is "speedup" = baseline time / our time (> 1: ours faster); "fraction" = ours / baseline
(for bandwidth, memory, TFLOP/s). A short table follows the JSON lines.

Run on the GPU: PYTHONPATH=packages/ats-kernels/src python3 benchmarks/kernels.py
Smoke-test the code paths on CPU (tiny shapes, Triton interpreter, no timings worth reading):
  uv run --no-sync python benchmarks/kernels.py --smoke
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before ats_kernels.triton decorates its kernels

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from ats_kernels import (  # noqa: E402
    REFERENCE,
    ref_cross_entropy,
    ref_linear_cross_entropy,
    ref_rms_norm,
    ref_rope,
    ref_swiglu,
    rope_tables,
)
from ats_kernels import triton as tk  # noqa: E402
from ats_kernels.triton.cross_entropy import auto_chunk_size  # noqa: E402

DEVICE = "cpu" if SMOKE else "cuda"
DTYPE = torch.bfloat16
HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None
ROWS: list[dict] = []
SECTIONS = ("rms_norm", "rope", "swiglu", "cross_entropy", "moe")


def hardware() -> str:
    name = (
        torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (Triton interpreter smoke run)"
    )
    return f"{name}; torch {torch.__version__}; triton {triton.__version__}"


HARDWARE = hardware()


def emit(name: str, ours: float, baseline: float, unit: str, ratio_is: str, **extra) -> None:
    ratio = baseline / ours if ratio_is == "speedup" else ours / baseline
    row = {"name": name, "ours": round(ours, 5), "baseline": round(baseline, 5),
           "ratio": round(ratio, 4), "ratio_is": ratio_is, "hardware": HARDWARE, "unit": unit, **extra}  # fmt: skip
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def bench_ms(fn: Callable[[], object], rep: int = 100) -> float:
    """Median ms of fn() (do_bench on CUDA; one timed call in the CPU smoke run)."""
    if DEVICE == "cuda":
        return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def fwd_bwd(
    fn: Callable, inputs: list[torch.Tensor], grads_out: list[torch.Tensor]
) -> Callable[[], object]:
    """A closure running fn(*inputs) and the backward of every output into the inputs."""

    def run():
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        return torch.autograd.grad(
            outs, [t for t in inputs if t.requires_grad], grads_out[: len(outs)]
        )

    return run


def compiled(fn: Callable) -> Callable:
    return fn if SMOKE else torch.compile(fn, dynamic=False)


def optional_baseline(label: str, make: Callable[[], Callable[[], object]]) -> float | None:
    """Time an optional baseline (Liger, torch.compile); a failure is printed as its own JSON line."""
    try:
        return bench_ms(make())
    except Exception as err:  # a broken optional baseline must not end a device run; it is reported
        print(
            json.dumps({"name": label, "error": f"{type(err).__name__}: {err}"[:300]}), flush=True
        )
        return None


def device_ceilings() -> tuple[float, float]:
    n = (64 if SMOKE else 1 << 30) // 2  # 1 GiB of bf16
    src = torch.empty(n, device=DEVICE, dtype=DTYPE).normal_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    copy_gbs = 2 * src.numel() * src.element_size() / ms / 1e6
    s = 64 if SMOKE else 8192
    a, b = (
        torch.randn(s, s, device=DEVICE, dtype=DTYPE),
        torch.randn(s, s, device=DEVICE, dtype=DTYPE),
    )
    mm_tflops = 2 * s**3 / bench_ms(lambda: a @ b) / 1e9
    print(
        json.dumps(
            {
                "name": "device_copy_bandwidth",
                "value": round(copy_gbs, 1),
                "unit": "GB/s",
                "hardware": HARDWARE,
            }
        )
    )
    print(json.dumps({"name": "device_bf16_matmul", "value": round(mm_tflops, 1), "unit": "TFLOP/s", "matmul": f"{s}^3", "hardware": HARDWARE}))  # fmt: skip
    return copy_gbs, mm_tflops


def graph_ms(run: Callable[[], object]) -> float:
    """do_bench of a CUDA-graph replay of run(): the GPU time without host launch gaps.

    do_bench's events count the GPU idling while the host (Python, autograd, Triton's launcher)
    enqueues a call that takes the GPU less time than that; at 16384x4096 these ops are near that
    line, and in training the host runs ahead of the GPU. Warmed on a side stream (torch's docs).
    """
    if DEVICE != "cuda":
        return bench_ms(run)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return bench_ms(graph.replay)


def optional_graph_ms(label: str, run: Callable[[], object]) -> float | None:
    """graph_ms(run); a capture failure is printed as its own JSON line (as optional_baseline)."""
    try:
        return graph_ms(run)
    except Exception as err:  # a function that cannot be captured must not end a device run
        print(
            json.dumps({"name": label, "error": f"{type(err).__name__}: {err}"[:300]}), flush=True
        )
        return None


def bench_elementwise(
    name, ours, baselines: dict[str, Callable | None], inputs, grads_out, n_bytes, copy_gbs
):
    """ours vs each baseline (fwd + bwd), and our achieved bandwidth as a fraction of copy.

    Each comparison twice: do_bench of the eager call (host overhead included) and of a CUDA-graph
    replay (`_gpu` rows: the kernels alone, what a step sees when the host runs ahead).
    """
    ours_ms = bench_ms(fwd_bwd(ours, inputs, grads_out))
    ours_gpu = optional_graph_ms(f"{name}_graph", fwd_bwd(ours, inputs, grads_out))
    for label, fn in baselines.items():
        if fn is None:
            continue
        base_ms = optional_baseline(
            f"{name}_vs_{label}", lambda fn=fn: fwd_bwd(fn, inputs, grads_out)
        )
        if base_ms is not None:
            emit(f"{name}_fwd_bwd_vs_{label}", ours_ms, base_ms, "ms", "speedup")
        base_gpu = optional_graph_ms(f"{name}_gpu_vs_{label}", fwd_bwd(fn, inputs, grads_out))
        if base_gpu is not None and ours_gpu is not None:
            emit(f"{name}_fwd_bwd_gpu_vs_{label}", ours_gpu, base_gpu, "ms", "speedup")
    emit(f"{name}_fwd_bwd_bandwidth", n_bytes / ours_ms / 1e6, copy_gbs, "GB/s", "fraction",
         bytes_moved=n_bytes, ours_ms=round(ours_ms, 4))  # fmt: skip
    if ours_gpu is not None:
        emit(f"{name}_fwd_bwd_gpu_bandwidth", n_bytes / ours_gpu / 1e6, copy_gbs, "GB/s",
             "fraction", bytes_moved=n_bytes, ours_ms=round(ours_gpu, 4))  # fmt: skip


def run_rms_norm(copy_gbs: float) -> None:
    M, C = (64, 128) if SMOKE else (16384, 4096)
    x = torch.randn(M, C, device=DEVICE, dtype=DTYPE, requires_grad=True)
    w = torch.randn(C, device=DEVICE, dtype=DTYPE, requires_grad=True)
    dy = torch.randn(M, C, device=DEVICE, dtype=DTYPE)
    baselines = {
        "eager": lambda a, b: ref_rms_norm(a, b, 1e-5),
        "compile": compiled(lambda a, b: ref_rms_norm(a, b, 1e-5)),
        "F.rms_norm": lambda a, b: F.rms_norm(a, (C,), b, 1e-5),
        "liger": None,
    }
    if HAS_LIGER and not SMOKE:
        from liger_kernel.transformers import LigerRMSNorm

        liger = LigerRMSNorm(C, eps=1e-5).to(DEVICE, DTYPE)
        # the module's weight is swapped for b so the gradient reaches the timed weight too
        baselines["liger"] = lambda a, b: torch.func.functional_call(liger, {"weight": b}, (a,))
    # fwd reads x, writes y; bwd reads dy, x, writes dx (weight and rstd are negligible)
    bench_elementwise("rms_norm", lambda a, b: tk.rms_norm(a, b, 1e-5), baselines, [x, w], [dy],
                      5 * M * C * 2, copy_gbs)  # fmt: skip


def run_rope(copy_gbs: float) -> None:
    B, T, H, Hk, hd = (1, 16, 4, 2, 32) if SMOKE else (4, 4096, 32, 8, 128)  # 16384 x 4096 q
    cos, sin = rope_tables(hd, T, device=DEVICE)
    q = torch.randn(B, H, T, hd, device=DEVICE, dtype=DTYPE, requires_grad=True)
    k = torch.randn(B, Hk, T, hd, device=DEVICE, dtype=DTYPE, requires_grad=True)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    baselines = {
        "eager": lambda a, b: ref_rope(a, b, cos, sin),
        "compile": compiled(lambda a, b: ref_rope(a, b, cos, sin)),
        "liger": None,
    }
    if HAS_LIGER and not SMOKE:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        cos1, sin1 = cos[None].to(DTYPE), sin[None].to(DTYPE)  # Liger wants (1, T, hd)
        baselines["liger"] = lambda a, b: liger_rotary_pos_emb(a, b, cos1, sin1)
    n_bytes = 4 * (q.numel() + k.numel()) * 2  # fwd and bwd each read and write q and k
    bench_elementwise("rope", lambda a, b: tk.rope(a, b, cos, sin), baselines, [q, k], [dq, dk],
                      n_bytes, copy_gbs)  # fmt: skip


def run_swiglu(copy_gbs: float) -> None:
    M, N = (64, 128) if SMOKE else (16384, 4096)
    g = torch.randn(M, N, device=DEVICE, dtype=DTYPE, requires_grad=True)
    u = torch.randn(M, N, device=DEVICE, dtype=DTYPE, requires_grad=True)
    dy = torch.randn(M, N, device=DEVICE, dtype=DTYPE)
    baselines = {"eager": ref_swiglu, "compile": compiled(ref_swiglu), "liger": None}
    if HAS_LIGER and not SMOKE:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        baselines["liger"] = LigerSiLUMulFunction.apply
    # fwd reads gate, up, writes y; bwd reads dy, gate, up, writes dgate, dup
    bench_elementwise("swiglu", tk.swiglu, baselines, [g, u], [dy], 8 * M * N * 2, copy_gbs)


def peak_gib(fn: Callable[[], object]) -> float:
    """Peak allocated memory above what is live before fn (its returned grads included), GiB."""
    if DEVICE != "cuda":
        fn()
        return float("nan")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**30


def run_linear_cross_entropy() -> None:
    N, C, V = (64, 32, 1000) if SMOKE else (8192, 4096, 128256)
    h = torch.randn(N, C, device=DEVICE, dtype=DTYPE, requires_grad=True)
    w = (torch.randn(V, C, device=DEVICE) / math.sqrt(C)).to(DTYPE).requires_grad_()
    t = torch.randint(0, V, (N,), device=DEVICE)
    t[::7] = -100

    def unfused(a, b):
        return ref_cross_entropy(a @ b.T, t)  # full (N, V) logits, upcast to fp32

    variants = {
        "ours": lambda a, b: tk.linear_cross_entropy(a, b, t),
        "unfused": unfused,
        "ref_chunked": lambda a, b: ref_linear_cross_entropy(a, b, t),
    }
    if HAS_LIGER and not SMOKE:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss(ignore_index=-100)
        variants["liger"] = lambda a, b: liger(b, a, t)
    one = torch.ones((), device=DEVICE)
    ms, mem = {}, {}
    for label, fn in variants.items():
        run = fwd_bwd(fn, [h, w], [one])
        if label == "liger":  # optional: a failure is reported as a JSON line, the run goes on
            t_liger = optional_baseline("linear_cross_entropy_vs_liger", lambda run=run: run)
            if t_liger is None:
                continue
            ms[label], mem[label] = t_liger, peak_gib(run)
        else:
            mem[label] = peak_gib(run)
            ms[label] = bench_ms(run, rep=300)
    extra = {"N": N, "C": C, "V": V, "dtype": "bf16", "chunk_rows": auto_chunk_size(V, DTYPE),
             "memory": "peak allocated above inputs, grads included"}  # fmt: skip
    for label in ("unfused", "ref_chunked", "liger"):
        if label in ms:
            emit(
                f"linear_cross_entropy_fwd_bwd_vs_{label}",
                ms["ours"],
                ms[label],
                "ms",
                "speedup",
                **extra,
            )
            emit(
                f"linear_cross_entropy_peak_memory_vs_{label}",
                mem["ours"],
                mem[label],
                "GiB",
                "fraction",
                **extra,
            )

    logits = torch.randn(N, V, device=DEVICE, dtype=DTYPE, requires_grad=True)
    ce = {
        "eager": lambda a: ref_cross_entropy(a, t),
        "compile": compiled(lambda a: ref_cross_entropy(a, t)),
    }
    ours_ms = bench_ms(fwd_bwd(lambda a: tk.cross_entropy(a, t), [logits], [one]))
    for label, fn in ce.items():
        base_ms = optional_baseline(
            f"cross_entropy_vs_{label}", lambda fn=fn: fwd_bwd(fn, [logits], [one])
        )
        if base_ms is not None:
            emit(f"cross_entropy_fwd_bwd_vs_{label}", ours_ms, base_ms, "ms", "speedup", N=N, V=V)


def _gmm_swiglu_mlp(x_sorted, counts, w1, w3, w2):
    """torch._grouped_mm through its own autograd, eager SwiGLU between (the grouped_mm baseline)."""
    offs = torch.cumsum(counts, 0).to(torch.int32)
    a = torch._grouped_mm(x_sorted, w1.transpose(1, 2), offs=offs)
    b = torch._grouped_mm(x_sorted, w3.transpose(1, 2), offs=offs)
    return torch._grouped_mm(ref_swiglu(a, b), w2.transpose(1, 2), offs=offs)


def moe_block(ks, x, router_w, w1, w3, w2, top_k):
    """The ats MoE FFN (dropless): route, permute, grouped SwiGLU, weighted unpermute."""
    logits = x @ router_w.T  # (N, E)
    weights, indices, _, _ = ks.moe_route(logits, top_k)
    x_sorted, counts, order = ks.moe_permute(x, indices, w1.shape[0])
    y_sorted = ks.grouped_mlp(x_sorted, counts, w1, w3, w2)
    return ks.moe_unpermute(y_sorted, order, weights)


def hf_moe_block(x, router_w, w1, w3, w2, top_k):
    """HF Mixtral-style block: loop over experts, gather their tokens, index_add the outputs."""
    E = w1.shape[0]
    probs = torch.softmax((x @ router_w.T).float(), dim=-1)
    weights, selected = torch.topk(probs, top_k, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
    out = torch.zeros_like(x)
    expert_mask = F.one_hot(selected, E).permute(2, 1, 0)  # (E, k, N)
    for e in range(E):
        slot, token = torch.where(expert_mask[e])
        cur = x[token]
        y = (F.silu(cur @ w1[e].T) * (cur @ w3[e].T)) @ w2[e].T
        out.index_add_(0, token, y * weights[token, slot, None])
    return out


def run_moe(matmul_tflops: float) -> None:
    # (E, top_k, C, F): Mixtral-8x7B expert shapes; a fine-grained 64-expert layer (OLMoE-like ratio)
    configs = (
        [(4, 2, 64, 96), (8, 4, 64, 32)] if SMOKE else [(8, 2, 4096, 14336), (64, 8, 4096, 2048)]
    )
    N = 64 if SMOKE else 16384
    triton_set = replace(REFERENCE, name="triton", moe_route=tk.moe_route, moe_permute=tk.moe_permute,
                         moe_unpermute=tk.moe_unpermute, grouped_mlp=tk.grouped_mlp)  # fmt: skip
    gmm_set = replace(REFERENCE, name="grouped_mm_eager", grouped_mlp=_gmm_swiglu_mlp)
    for E, k, C, Fe in configs:
        g = torch.Generator(device=DEVICE).manual_seed(0)
        x = torch.randn(N, C, device=DEVICE, dtype=DTYPE, generator=g).requires_grad_()
        router_w = (
            (torch.randn(E, C, device=DEVICE, generator=g) * C**-0.5).to(DTYPE).requires_grad_()
        )
        ws = [(torch.randn(E, a, b, device=DEVICE, generator=g) * b**-0.5).to(DTYPE).requires_grad_()
              for a, b in ((Fe, C), (Fe, C), (C, Fe))]  # fmt: skip
        dy = torch.randn(N, C, device=DEVICE, dtype=DTYPE)
        flops = 3 * 2 * 3 * (N * k) * C * Fe  # expert GEMMs only: 3 matmuls, fwd + 2x bwd
        inputs = [x, router_w, *ws]
        variants = {
            "ours": lambda *a, k=k: moe_block(triton_set, *a, k),
            "reference": lambda *a, k=k: moe_block(REFERENCE, *a, k),
            "hf_loop": lambda *a, k=k: hf_moe_block(*a, k),
        }
        if hasattr(torch, "_grouped_mm") and not SMOKE:
            variants["grouped_mm_eager"] = lambda *a, k=k: moe_block(gmm_set, *a, k)
        ms = {}
        for label, fn in variants.items():
            run = fwd_bwd(fn, inputs, [dy])
            if label == "grouped_mm_eager":  # relies on torch's own _grouped_mm autograd
                t = optional_baseline(f"moe_E{E}_grouped_mm_eager", lambda run=run: run)
                if t is not None:
                    ms[label] = t
            else:
                ms[label] = bench_ms(run, rep=300)
        # dense SwiGLU MLP with the same expert FLOPs: N tokens, hidden k * F
        d1 = (torch.randn(k * Fe, C, device=DEVICE) * C**-0.5).to(DTYPE).requires_grad_()
        d3 = (torch.randn(k * Fe, C, device=DEVICE) * C**-0.5).to(DTYPE).requires_grad_()
        d2 = (torch.randn(C, k * Fe, device=DEVICE) * (k * Fe) ** -0.5).to(DTYPE).requires_grad_()
        dense_ms = bench_ms(fwd_bwd(lambda a, b1, b3, b2: tk.swiglu(a @ b1.T, a @ b3.T) @ b2.T,
                                    [x, d1, d3, d2], [dy]), rep=300)  # fmt: skip
        extra = {"E": E, "top_k": k, "tokens": N, "C": C, "F": Fe, "dtype": "bf16"}
        for label in ms:
            if label != "ours":
                emit(
                    f"moe_E{E}_top{k}_fwd_bwd_vs_{label}",
                    ms["ours"],
                    ms[label],
                    "ms",
                    "speedup",
                    **extra,
                )
        tf = {label: flops / t / 1e9 for label, t in ms.items()}
        emit(f"moe_E{E}_top{k}_tflops_vs_dense_mlp", tf["ours"], flops / dense_ms / 1e9, "TFLOP/s", "fraction",
             device_matmul_tflops=round(matmul_tflops, 1), **extra)  # fmt: skip


def summary() -> None:
    print("\nname                                              ours        baseline     ratio")
    for r in ROWS:
        print(
            f"{r['name']:<48} {r['ours']:>10.4g} {r['baseline']:>12.4g} {r['ratio']:>8.3f} {r['ratio_is']} ({r['unit']})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes on CPU via TRITON_INTERPRET=1"
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help="comma-separated subset of sections"
    )
    args = parser.parse_args()
    if not SMOKE and not torch.cuda.is_available():
        raise SystemExit(
            "benchmarks/kernels.py: no CUDA device (use --smoke for a CPU code-path check)"
        )
    only = set(args.only.split(","))
    unknown = only - set(SECTIONS)
    if unknown:
        raise SystemExit(
            f"benchmarks/kernels.py: --only {sorted(unknown)} unknown; choose from {SECTIONS}"
        )
    torch.manual_seed(0)
    copy_gbs, mm_tflops = device_ceilings()
    sections = {
        "rms_norm": lambda: run_rms_norm(copy_gbs),
        "rope": lambda: run_rope(copy_gbs),
        "swiglu": lambda: run_swiglu(copy_gbs),
        "cross_entropy": run_linear_cross_entropy,
        "moe": lambda: run_moe(mm_tflops),
    }
    failed = []
    for name in SECTIONS:
        if name not in only:
            continue
        try:
            sections[name]()
        except Exception as err:  # one broken section must not cost the other measurements
            failed.append(name)
            trace = traceback.format_exc(limit=-3)
            print(json.dumps({"name": f"section_{name}", "error": f"{type(err).__name__}: {err}"[:500], "trace": trace[-1500:]}), flush=True)  # fmt: skip
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    summary()
    if failed:
        raise SystemExit(f"benchmarks/kernels.py: sections failed: {failed} (see the error lines)")


if __name__ == "__main__":
    main()
