"""Kernel ladder for RMSNorm, RoPE and SwiGLU (issue 5): validates and times every dev/<op>/NN_*.py
variant and the production kernel (src) against F.rms_norm / torch.compile of the ref_ op.

Each variant module exposes the ref signature (rms_norm(x, w, eps), rope(q, k, cos, sin),
swiglu(gate, up)). Check: fwd + bwd against the ref on fresh random bf16 inputs, outputs poisoned
with NaN through the caching allocator first. Time: do_bench medians of fwd, bwd (retained graph),
fwd+bwd, and fwd+bwd replayed from a CUDA graph (GPU time without host gaps), plus the host time
to enqueue one fwd+bwd; then the kernels each fwd+bwd launches (torch.profiler, first shape; skip
with --no-profile). GB/s counts the bytes that must move (as benchmarks/kernels.py does), % of a copy
measured here. Ends with the fastest variant per op and shape.

GPU:  PYTHONPATH=packages/ats-kernels/src python3 packages/ats-kernels/dev/bench_ladder.py
CPU:  uv run --no-sync python packages/ats-kernels/dev/bench_ladder.py --interpret-smoke
"""

import importlib
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

SMOKE = "--interpret-smoke" in sys.argv
PROFILE = "--no-profile" not in sys.argv and not SMOKE  # kernel list per variant, first shape
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is decorated

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from ats_kernels import ref_rms_norm, ref_rope, ref_swiglu, rope_tables  # noqa: E402
from ats_kernels import triton as tk  # noqa: E402

DEV = Path(__file__).parent
DEVICE = "cpu" if SMOKE else "cuda"
DTYPE = torch.bfloat16
EPS = 1e-5
# (M, N) for rms_norm / swiglu; rope uses B=4, hd=128, 32 q and 8 k heads, T = M / 4 * N / 4096
SHAPES = [(8, 64), (5, 96)] if SMOKE else [(16384, 4096), (4096, 8192), (32768, 2048)]


def _body(path: Path) -> str:
    """A module's source without its opening docstring and blank lines (import grouping differs)."""
    text = re.sub(r'^""".*?"""\n', "", path.read_text(), count=1, flags=re.S)
    return "\n".join(line for line in text.splitlines() if line.strip())


def variants(op: str) -> dict:
    """{"01_baseline": fn, ...} for one op, plus "src" (production) unless it copies a variant."""
    out, src = {}, _body(Path(importlib.import_module(f"ats_kernels.triton.{op}").__file__))
    for path in sorted((DEV / op).glob("[0-9][0-9]_*.py")):
        spec = importlib.util.spec_from_file_location(f"dev_{op}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out[path.stem] = getattr(module, op)
        if _body(path) == src:
            print(f"src/ats_kernels/triton/{op}.py is {op}/{path.name} (not timed twice)")
            src = None
    if src is not None:
        out["src"] = getattr(tk, op)
    return out


def make_case(op: str, M: int, N: int, layout: str = "bhtd"):
    """(inputs with grad, output grads, ref fn, baselines, bytes that must move fwd+bwd).

    rope: layout "bhtd" passes contiguous (B, H, T, hd) q and k; "bthd" passes what the model
    passes, wq(x).view(B, T, H, hd).transpose(1, 2) of a (B, T, H*hd) leaf, so the closure
    includes the view/transpose backward (a copy when the gradient comes back in another layout).
    """
    g = lambda *s: torch.randn(*s, device=DEVICE, dtype=DTYPE)  # noqa: E731
    if op == "rms_norm":
        x, w = g(M, N).requires_grad_(), (g(N) + 1).requires_grad_()
        ref = lambda a, b: ref_rms_norm(a, b, EPS)  # noqa: E731
        base = {"F.rms_norm": lambda a, b: F.rms_norm(a, (N,), b, EPS)}
        # fwd reads x, writes y; bwd reads dy, x, writes dx (weight, rstd, dw are negligible)
        return [x, w], [g(M, N)], ref, base, 5 * M * N * 2
    if op == "rope":
        B, H, Hk, hd = 4, 32, 8, 128
        T = max(1, M * N // (B * H * hd))
        cos, sin = rope_tables(hd, T, device=DEVICE)
        if layout == "bthd":
            q, k = g(B, T, H * hd).requires_grad_(), g(B, T, Hk * hd).requires_grad_()

            def heads(a, b):  # as ats_model's Attention: (B, T, H*hd) -> (B, H, T, hd) views
                return (a.view(B, T, H, hd).transpose(1, 2), b.view(B, T, Hk, hd).transpose(1, 2))
        else:
            q, k = g(B, H, T, hd).requires_grad_(), g(B, Hk, T, hd).requires_grad_()

            def heads(a, b):
                return a, b

        ref = lambda a, b: ref_rope(*heads(a, b), cos, sin)  # noqa: E731
        n_bytes = 4 * (q.numel() + k.numel()) * 2  # fwd and bwd each read and write q and k
        grads = [g(B, H, T, hd), g(B, Hk, T, hd)]
        return [q, k], grads, ref, {}, n_bytes, (cos, sin, heads)
    gate, up = (g(M, N) * 3).requires_grad_(), g(M, N).requires_grad_()
    # fwd reads gate, up, writes y; bwd reads dy, gate, up, writes dgate, dup
    return [gate, up], [g(M, N)], ref_swiglu, {}, 8 * M * N * 2


def bind(op: str, fn, case):
    """The variant as a function of the differentiable inputs only."""
    if op == "rms_norm":
        return lambda a, b: fn(a, b, EPS)
    if op == "rope":
        cos, sin, heads = case[5]
        return lambda a, b: fn(*heads(a, b), cos, sin)
    return fn


def poison(tensors) -> None:
    """Leave NaN in the caching allocator's free blocks of these sizes, so unwritten output shows."""
    if DEVICE == "cuda":
        junk = [torch.full_like(t, float("nan")) for t in tensors]
        del junk


def check(op: str, name: str, fn, inputs, grads_out, ref) -> None:
    fresh = [torch.randn_like(t).requires_grad_() for t in inputs]
    if op == "rms_norm":
        fresh[1] = (fresh[1].detach() + 1).requires_grad_()
    dys = [torch.randn_like(t) for t in grads_out]
    poison(grads_out + fresh)
    outs = fn(*fresh)
    outs = outs if isinstance(outs, tuple) else (outs,)
    poison(fresh)
    grads = torch.autograd.grad(outs, fresh, dys)
    ref_outs = ref(*fresh)
    ref_outs = ref_outs if isinstance(ref_outs, tuple) else (ref_outs,)
    ref_grads = torch.autograd.grad(ref_outs, fresh, dys)
    for what, a, b in zip(["out"] * len(outs) + ["grad"] * len(grads), outs + grads,
                          ref_outs + ref_grads, strict=True):  # fmt: skip
        a, b = a.detach().float(), b.detach().float()
        err = float((a - b).norm() / b.norm().clamp_min(1e-30))
        if not torch.isfinite(a).all() or err > 2e-2:
            raise AssertionError(
                f"{op} {name} {what}: rel err {err:.3g}, finite {a.isfinite().all()}"
            )


def ms(fn) -> float:
    if SMOKE:
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def time_variant(fn, inputs, grads_out) -> tuple[float, ...]:
    """(fwd, bwd, fwd+bwd, fwd+bwd replayed from a CUDA graph, host ms per fwd+bwd call) in ms.

    fwd+bwd is what a training step runs: the forward, then autograd.grad with an upstream
    gradient that already exists (dw included). do_bench times it between CUDA events, so when the
    host (Python, autograd, Triton's launcher) takes longer to enqueue a call than the GPU takes to
    run it plus do_bench's 256 MB L2 flush, the GPU idles and the idle time is counted. The graph
    column replays the same kernels with no host work: the GPU time alone. host = wall time to
    enqueue one call (no synchronize inside), so host > graph means launch-bound at this shape.
    """
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    fwd = ms(lambda: fn(*inputs))
    bwd = ms(lambda: torch.autograd.grad(outs, inputs, grads_out, retain_graph=True))

    both = bind_both(fn, inputs, grads_out)
    both_ms = ms(both)
    if SMOKE:
        return fwd, bwd, both_ms, float("nan"), float("nan")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        both()
    host = (time.perf_counter() - t0) / 10 * 1e3
    torch.cuda.synchronize()
    return fwd, bwd, both_ms, graph_ms(both), host


def graph_ms(both) -> float:
    """do_bench of one CUDA-graph replay of both() (warmed on a side stream, as torch's docs do)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            both()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            both()
    except RuntimeError as err:  # reported in the table as nan, with the reason printed here
        print(f"CUDA graph capture failed: {str(err)[:200]}")
        return float("nan")
    return ms(graph.replay)


def profile_kernels(label: str, both) -> None:
    """Every GPU kernel one fwd+bwd call launches, with its device time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    both()
    torch.cuda.synchronize()
    n = 5
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                both()
            torch.cuda.synchronize()
    except RuntimeError as err:  # diagnostics only: the timings above stand without it
        print(f"  profiler failed for {label}: {str(err)[:200]}")
        return
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) / n / 1e3
    print(f"  kernels of one fwd+bwd call, {label}: {total:.4f} ms of device time")
    for e in sorted(events, key=lambda e: -e.self_device_time_total):
        print(f"    {e.self_device_time_total / n / 1e3:8.4f} ms  x{e.count // n}  {e.key[:90]}")


def bind_both(fn, inputs, grads_out):
    def both():
        o = fn(*inputs)
        return torch.autograd.grad(o if isinstance(o, tuple) else (o,), inputs, grads_out)

    return both


def copy_gbs() -> float:
    src = torch.randn(1 << 29 if not SMOKE else 64, device=DEVICE, dtype=DTYPE)  # 1 GiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / ms(lambda: dst.copy_(src)) / 1e6


def main() -> None:
    copy = copy_gbs()
    name = "CPU interpreter smoke" if SMOKE else torch.cuda.get_device_name()
    print(f"{name}; torch {torch.__version__}; triton {triton.__version__}; copy {copy:.0f} GB/s")
    rows, best = [], {}
    for op in ("rms_norm", "rope", "swiglu"):
        fns = variants(op)
        # rope also on the model's (B, T, H, hd) memory layout at the first shape
        layouts = [(M, N, "bhtd") for M, N in SHAPES] + (
            [(*SHAPES[0], "bthd")] if op == "rope" else []
        )
        for M, N, layout in layouts:
            case = make_case(op, M, N, layout)
            shape = f"{M}x{N}" + (" bthd" if layout == "bthd" else "")
            inputs, grads_out, ref, base, n_bytes = case[:5]
            timed = {k: bind(op, f, case) for k, f in fns.items()}
            if not SMOKE and (M, N) == SHAPES[0]:
                timed |= {"compile": torch.compile(ref, dynamic=False)}
            timed |= base
            for label, fn in timed.items():
                if label in fns:
                    check(op, label, fn, inputs, grads_out, ref)
                f, b, fb, fbg, host = time_variant(fn, inputs, grads_out)
                rows.append((op, shape, label, f, b, fb, fbg, host, n_bytes / fb / 1e6))
                print("ROW", *(f"{v:.4f}" if isinstance(v, float) else v for v in rows[-1]),
                      flush=True)  # as measured: a run cut short keeps what it timed  # fmt: skip
                if PROFILE and (M, N) == SHAPES[0]:
                    profile_kernels(f"{op} {shape} {label}", bind_both(fn, inputs, grads_out))
                gpu = fbg if fbg == fbg else fb  # graph time when captured (GPU alone)
                if label in fns and gpu == gpu and gpu < best.get((op, shape), ("", 1e9))[1]:
                    best[(op, shape)] = (label, gpu)
    print(f"{'op':9} {'shape':16} {'variant':24} {'fwd ms':>8} {'bwd ms':>8} {'f+b ms':>8} "
          f"{'graph ms':>8} {'host ms':>8} {'GB/s':>7} {'%copy':>6} {'%copy graph':>11}")  # fmt: skip
    for op, shape, label, f, b, fb, fbg, host, gbs in rows:
        print(f"{op:9} {shape:16} {label:24} {f:8.4f} {b:8.4f} {fb:8.4f} {fbg:8.4f} {host:8.4f} "
              f"{gbs:7.0f} {100 * gbs / copy:6.1f} {100 * gbs * fb / fbg / copy:11.1f}")  # fmt: skip
    # ranked by GPU time (graph replay): in training the host runs ahead of the GPU
    for (op, shape), (label, gpu) in best.items():
        ref_gpu = {r[2]: r[6] if r[6] == r[6] else r[5]
                   for r in rows if r[0] == op and r[1] == shape}  # fmt: skip
        vs = "  ".join(f"{t / gpu:.2f}x {k}" for k, t in ref_gpu.items() if k not in fns_of(op))
        print(f"FASTEST {op} {shape}: {label} {gpu:.4f} ms GPU  {vs}")
    print("interpret smoke: every variant matched its reference" if SMOKE else "done")


def fns_of(op: str) -> set[str]:
    return {p.stem for p in (DEV / op).glob("[0-9][0-9]_*.py")} | {"src"}


if __name__ == "__main__":
    main()
