"""Kernel ladder for RMSNorm, RoPE and SwiGLU (issue 5): validates and times every dev/<op>/NN_*.py
variant and the production kernel (src) against F.rms_norm / torch.compile of the ref_ op.

Each variant module exposes the ref signature (rms_norm(x, w, eps), rope(q, k, cos, sin),
swiglu(gate, up)). Check: fwd + bwd against the ref on fresh random bf16 inputs, outputs poisoned
with NaN through the caching allocator first. Time: do_bench medians of fwd, bwd (retained graph)
and fwd+bwd; GB/s counts the bytes that must move (as benchmarks/kernels.py does), % of a copy
measured here. Ends with the fastest variant per op and shape.

GPU:  PYTHONPATH=packages/ats-kernels/src python3 packages/ats-kernels/dev/bench_ladder.py
CPU:  uv run --no-sync python packages/ats-kernels/dev/bench_ladder.py --interpret-smoke
"""

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

SMOKE = "--interpret-smoke" in sys.argv
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


def make_case(op: str, M: int, N: int):
    """(inputs with grad, output grads, ref fn, baselines, bytes that must move fwd+bwd)."""
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
        q = g(B, H, T, hd).requires_grad_()
        k = g(B, Hk, T, hd).requires_grad_()
        ref = lambda a, b: ref_rope(a, b, cos, sin)  # noqa: E731
        n_bytes = 4 * (q.numel() + k.numel()) * 2  # fwd and bwd each read and write q and k
        return [q, k], [g(*q.shape), g(*k.shape)], ref, {}, n_bytes, (cos, sin)
    gate, up = (g(M, N) * 3).requires_grad_(), g(M, N).requires_grad_()
    # fwd reads gate, up, writes y; bwd reads dy, gate, up, writes dgate, dup
    return [gate, up], [g(M, N)], ref_swiglu, {}, 8 * M * N * 2


def bind(op: str, fn, case):
    """The variant as a function of the differentiable inputs only."""
    if op == "rms_norm":
        return lambda a, b: fn(a, b, EPS)
    if op == "rope":
        cos, sin = case[5]
        return lambda a, b: fn(a, b, cos, sin)
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


def time_variant(fn, inputs, grads_out) -> tuple[float, float, float]:
    """(fwd, bwd, fwd+bwd) ms; bwd replays autograd on one retained graph."""
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    fwd = ms(lambda: fn(*inputs))
    bwd = ms(lambda: torch.autograd.grad(outs, inputs, grads_out, retain_graph=True))

    def both():
        o = fn(*inputs)
        return torch.autograd.grad(o if isinstance(o, tuple) else (o,), inputs, grads_out)

    return fwd, bwd, ms(both)


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
        for M, N in SHAPES:
            case = make_case(op, M, N)
            inputs, grads_out, ref, base, n_bytes = case[:5]
            timed = {k: bind(op, f, case) for k, f in fns.items()}
            if not SMOKE and (M, N) == SHAPES[0]:
                timed |= {"compile": torch.compile(ref, dynamic=False)}
            timed |= base
            for label, fn in timed.items():
                if label in fns:
                    check(op, label, fn, inputs, grads_out, ref)
                f, b, fb = time_variant(fn, inputs, grads_out)
                rows.append((op, f"{M}x{N}", label, f, b, fb, n_bytes / fb / 1e6))
                if label in fns and fb == fb and fb < best.get((op, M, N), ("", 1e9))[1]:
                    best[(op, M, N)] = (label, fb)
    print(f"{'op':9} {'shape':11} {'variant':24} {'fwd ms':>8} {'bwd ms':>8} {'f+b ms':>8} "
          f"{'GB/s':>7} {'%copy':>6}")  # fmt: skip
    for op, shape, label, f, b, fb, gbs in rows:
        print(f"{op:9} {shape:11} {label:24} {f:8.4f} {b:8.4f} {fb:8.4f} {gbs:7.0f} "
              f"{100 * gbs / copy:6.1f}")  # fmt: skip
    for (op, M, N), (label, fb) in best.items():
        ref_fb = {r[2]: r[5] for r in rows if r[0] == op and r[1] == f"{M}x{N}"}
        vs = "  ".join(f"{fb_b / fb:.2f}x {k}" for k, fb_b in ref_fb.items() if k not in fns_of(op))
        print(f"FASTEST {op} {M}x{N}: {label} {fb:.4f} ms  {vs}")
    print("interpret smoke: every variant matched its reference" if SMOKE else "done")


def fns_of(op: str) -> set[str]:
    return {p.stem for p in (DEV / op).glob("[0-9][0-9]_*.py")} | {"src"}


if __name__ == "__main__":
    main()
