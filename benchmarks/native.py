"""Native runtime benchmark: prefill and batch-1 decode tokens/s of the ATS C++ runtime
(`ats_native.Model`) on this CPU, against (a) ats-model in PyTorch eager (fp32) and (b) llama.cpp
(`llama-cpp-python`, built from its PyPI sdist) on the GGUF export of the same weights:
ats fp32 vs F32, ats int8 vs Q8_0, ats int4 (groups of 32) vs Q4_0.

Models (random-init weights: speed does not depend on their values), defined below:
    dense-254m   Llama shape, dim 1024, 16 layers, GQA 16/8 heads, SwiGLU 2816, vocab 32000
    moe-879m     dim 896, 12 layers, 16 experts of SwiGLU 1536, top-2: 879M total, 186M active
Every engine runs 2 threads, greedy, the same random prompt of --prompt-len ids; prefill tokens/s =
prompt length / time to the first new token; decode tokens/s = further tokens / their time. Each
figure is the best of --reps runs after a warm-up (the machine may be shared).

Artefacts are cached between runs under --cache (default ~/.cache/ats-bench): model directories,
their int8/int4 copies, GGUF files, and the llama.cpp venv, which the script creates on first use
(`uv venv` + `uv pip install --no-binary llama-cpp-python llama-cpp-python==LLAMA_CPP_VERSION`;
compiling llama.cpp on 2 cores takes 20-30 minutes). First run: ~25 GB of disk and a few minutes
of preparation; later runs: ~8 minutes.

Prints one JSON line per measurement: {"name", "ours", "baseline", "ratio", "hardware", "unit"},
ratio = ours / baseline (> 1: ATS is faster).

Compute ceiling: the CPU's measured peak multiply-add rate (`ats_native.cpu_peak`: register-only
loops of int8 dot products, AVX-512 VNNI vpdpbusd, and of fp32 FMA, on the same 2 threads) and
every prefill as a fraction of it (weight-matmul multiply-adds per token x tokens/s; attention
scores left out, a few % at 128 tokens). Rows "..._fraction-of-peak": ours = GMAC/s done,
baseline = the peak, ratio = the fraction; "5x-torch-eager_vs_int8-peak": the rate a prefill 5x
PyTorch eager would need against the int8 peak (ratio > 1: out of reach on this CPU).
`--batch N` measures instead, per rep, N sequences decoding together in one `ats_native.Batch`
against one (aggregate tokens/s, the two back to back): the engine's own ceiling on what a
server's continuous batching gives over serving one client (benchmarks/serving.py).
`--kv-cache f16` runs the ATS engine with its half-precision KV cache (llama.cpp's default cache
type; ats_native.Model's kv_cache).
Run: uv run --no-sync python benchmarks/native.py [--models dense moe] [--reps 2] [--batch N]
GPU (native runtime built with ATS_CUDA=ON): benchmarks/native.py --device cuda [native_cuda.py's
options], see benchmarks/native_cuda.py.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np  # both venvs have it: the llama.cpp worker runs this file too

LLAMA_CPP_VERSION = "0.3.36"
THREADS = 2
PRECISIONS = {"fp32": ("f32", None), "int8": ("q8_0", (8, None)), "int4": ("q4_0", (4, 32))}
# the peak each precision's prefill is held against: integer dots for int8/int4 weights (the
# activations are rounded to int8), fp32 FMA for fp32
PEAK_KINDS = ("int8", "fp32")
PEAK_OF = {"fp32": "fp32", "int8": "int8", "int4": "int8"}


def model_configs() -> dict[str, dict]:
    """ModelConfig fields of the two benchmark models (plain dicts: ats_model loads lazily)."""
    common = dict(vocab_size=32000, max_seq_len=2048, rope_theta=10000.0, tie_embeddings=False)
    return {
        "dense-254m": dict(
            common, family="dense", dim=1024, n_layer=16, n_head=16, n_kv_head=8, ffn_dim=2816
        ),
        "moe-879m": dict(
            common,
            family="moe",
            dim=896,
            n_layer=12,
            n_head=14,
            n_kv_head=7,
            ffn_dim=1536,
            moe=dict(n_experts=16, top_k=2),
        ),
    }


def macs_per_token(fields: dict) -> int:
    """Multiply-adds of the weight matmuls one token runs (MoE: the top_k chosen experts, the
    router and any shared experts; LM head included), from the ModelConfig fields."""
    C, F, V, L = fields["dim"], fields["ffn_dim"], fields["vocab_size"], fields["n_layer"]
    head_dim = fields.get("head_dim") or C // fields["n_head"]
    H, KV = fields["n_head"] * head_dim, fields["n_kv_head"] * head_dim
    attn = C * H + 2 * C * KV + H * C
    moe = fields.get("moe")
    if moe is None:
        ffn = 3 * C * F
    else:
        n_ffn = moe["top_k"] + moe.get("n_shared_experts", 0)
        ffn = 3 * C * F * n_ffn + moe["n_experts"] * C
    return L * (attn + ffn) + V * C


def measured_peak(reps: int) -> dict[str, float]:
    """{"int8", "fp32"}: best of `reps` measurements of the peak multiply-adds/s (the machine may
    be shared: the best is the closest to the CPU's own)."""
    import ats_native

    return {k: max(ats_native.cpu_peak(k, THREADS, 0.5) for _ in range(reps)) for k in PEAK_KINDS}


def hardware() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{model}, {os.cpu_count()} cores, {THREADS} threads"


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


# ---- preparation (cached) ---------------------------------------------------------------------
def build_once(target: Path, make) -> Path:
    """Run make(tmp) and rename tmp to target, so an interrupted run never leaves half a file."""
    if target.exists():
        return target
    tmp = target.with_name(target.name + ".tmp")
    if tmp.is_dir():
        shutil.rmtree(tmp)
    tmp.unlink(missing_ok=True)
    start = time.perf_counter()
    make(tmp)
    tmp.rename(target)
    log(f"built {target.name} in {time.perf_counter() - start:.0f}s")
    return target


def make_tokenizer(path: Path) -> None:
    import sysconfig

    from ats_tokenizer import Tokenizer

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:60]
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    Tokenizer.train(texts, 4096).save(path)  # the model's 32000 rows pad the vocabulary


def make_model(fields: dict, tokenizer: Path):
    def make(out: Path) -> None:
        import torch
        from ats_model import ModelConfig, build_model, save_pretrained

        torch.manual_seed(0)
        save_pretrained(build_model(ModelConfig(**fields)), out, tokenizer_json=tokenizer)

    return make


def prepare(cache: Path, name: str, fields: dict) -> dict[str, dict[str, Path]]:
    """{precision: {"ats": model dir, "gguf": file}} for one model, built on first use. Names carry
    a hash of the full config.json, so a ModelConfig schema change rebuilds instead of failing."""
    from ats_infer.gguf_export import export_gguf
    from ats_infer.quantize import quantize_model_dir
    from ats_model import ModelConfig

    config = json.dumps(ModelConfig(**fields).to_dict(), sort_keys=True).encode()
    name = f"{name}-{hashlib.sha256(config).hexdigest()[:8]}"
    cache.mkdir(parents=True, exist_ok=True)
    tokenizer = build_once(cache / "tokenizer.json", make_tokenizer)
    base = build_once(cache / name, make_model(fields, tokenizer))
    paths = {}
    for precision, (outtype, scheme) in PRECISIONS.items():
        ats = base
        if scheme is not None:
            ats = build_once(
                cache / f"{name}-{precision}",
                lambda out, s=scheme: quantize_model_dir(base, out, *s),
            )
        gguf = build_once(
            cache / f"{name}-{outtype}.gguf", lambda out, t=outtype: export_gguf(base, out, t)
        )
        paths[precision] = {"ats": ats, "gguf": gguf}
    return paths


# ---- measurements -----------------------------------------------------------------------------
def timed_generation(step_first, step_next, n_decode: int) -> tuple[float, float]:
    """(seconds to the first token, seconds for n_decode further tokens)."""
    start = time.perf_counter()
    step_first()
    first = time.perf_counter()
    for _ in range(n_decode):
        step_next()
    return first - start, time.perf_counter() - first


def best_rates(run, prompt_len: int, n_decode: int, reps: int) -> tuple[float, float]:
    """Warm up once, then the best prefill and decode tokens/s over `reps` runs."""
    run()
    prefill, decode = 0.0, 0.0
    for _ in range(reps):
        t_prefill, t_decode = run()
        prefill = max(prefill, prompt_len / t_prefill)
        decode = max(decode, n_decode / t_decode)
    return prefill, decode


def bench_ats(
    model_dir: Path, prompt: list[int], n_decode: int, reps: int, kv_cache: str
) -> tuple[float, float]:
    import ats_native

    model = ats_native.Model(str(model_dir), threads=THREADS, kv_cache=kv_cache)

    def run() -> tuple[float, float]:
        tokens = iter(model.generate(prompt, n_decode + 1))  # greedy
        return timed_generation(lambda: next(tokens), lambda: next(tokens), n_decode)

    return best_rates(run, len(prompt), n_decode, reps)


def bench_batched(
    model_dir: Path, prompt: list[int], batch: int, n_decode: int, reps: int, kv_cache: str
) -> list[tuple[float, float]]:
    """Per rep, (aggregate decode tokens/s of `batch` sequences decoding together in one
    ats_native.Batch, that of one sequence), the two measured back to back (the machine's speed
    drifts between reps), after a warm-up of each: what the engine itself gives a server's
    continuous batching, before any HTTP. Prompts (rotations of `prompt`) prefilled first, not
    timed; greedy."""
    import ats_native

    model = ats_native.Model(str(model_dir), threads=THREADS, kv_cache=kv_cache)

    def rate(n_seq: int) -> float:
        b = ats_native.Batch(model, n_slots=n_seq, max_len=len(prompt) + n_decode + 2)
        for slot in range(n_seq):
            b.start(slot, prompt[slot:] + prompt[:slot], n_decode + 1)
        b.step(0)  # every prompt prefilled, first tokens sampled
        start = time.perf_counter()
        produced = sum(len(b.step(0)) for _ in range(n_decode))
        return produced / (time.perf_counter() - start)

    rate(batch), rate(1)
    return [(rate(batch), rate(1)) for _ in range(reps)]


def bench_torch(
    model_dir: Path, prompt: list[int], n_decode: int, reps: int
) -> tuple[float, float]:
    """ats-model eager fp32 through its own KV-cache generate(); a forward hook stamps the end of
    each forward (the first is the prefill, then one per decoded token)."""
    import torch
    from ats_model import generate, load_pretrained

    torch.set_num_threads(THREADS)
    model = load_pretrained(model_dir).eval()
    ids = torch.tensor([prompt])
    stamps: list[float] = []
    model.register_forward_hook(lambda *_: stamps.append(time.perf_counter()))

    def run() -> tuple[float, float]:
        stamps.clear()
        start = time.perf_counter()
        generate(model, ids, n_decode + 1, temperature=0.0)
        return stamps[0] - start, stamps[-1] - stamps[0]

    return best_rates(run, len(prompt), n_decode, reps)


def load_libstdcxx_globally() -> None:
    """Put libstdc++ in the process's global symbol scope before llama_cpp loads libllama.

    libllama/libggml built from the llama-cpp-python sdist on the GPU machine's image list no
    libstdc++ in DT_NEEDED (`readelf -d`), so in a Python process, which does not link libstdc++,
    their first iostream call (a std::stringstream in llama_model::print_info) segfaults; the
    GGUF files are not at fault: llama.cpp's own llama-simple, built from the same source and
    linked by g++, loads and decodes them there, and with libstdc++ loaded first (this function,
    or LD_PRELOAD) llama_cpp does too. Where libllama already needs libstdc++ this changes nothing.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("stdc++")
    if name is None:
        raise RuntimeError(
            "libstdc++ not found (ctypes.util.find_library('stdc++')); llama.cpp needs it"
        )
    ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)


def llama_cpp_worker(args: argparse.Namespace) -> None:
    """Runs inside the llama.cpp venv (no ATS imports): prints {"prefill", "decode"} tokens/s and
    saves the logits after the prompt to args.logits_out (the same-weights check)."""
    load_libstdcxx_globally()
    import llama_cpp

    gguf, prompt_len, n_decode = args.llama_cpp_worker, args.prompt_len, args.decode
    llm = llama_cpp.Llama(
        model_path=gguf,
        n_ctx=prompt_len + n_decode + 8,
        n_batch=prompt_len,
        n_ubatch=prompt_len,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        verbose=False,
    )
    prompt = random_prompt(llm.n_vocab(), prompt_len, args.seed)
    vocab = llm.n_vocab()

    def logits() -> np.ndarray:  # the last evaluated token's logits
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))

    def greedy() -> int:
        return int(np.argmax(logits()))

    def run() -> tuple[float, float]:
        llm.reset()
        state = {}

        def step_first() -> None:
            llm.eval(prompt)
            state["token"] = greedy()

        def step_next() -> None:
            llm.eval([state["token"]])
            state["token"] = greedy()

        return timed_generation(step_first, step_next, n_decode)

    prefill, decode = best_rates(run, prompt_len, n_decode, args.reps)
    llm.reset()
    llm.eval(prompt)
    np.save(args.logits_out, logits())
    print(json.dumps({"prefill": prefill, "decode": decode}))


def random_prompt(vocab: int, length: int, seed: int) -> list[int]:

    return np.random.default_rng(seed).integers(0, vocab, length).tolist()


def ensure_llama_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if python.is_file():
        return python
    log(f"creating {venv} and building llama-cpp-python {LLAMA_CPP_VERSION} (20-30 min)")
    subprocess.run(["uv", "venv", str(venv), "--python", "3.11"], check=True)
    subprocess.run(
        ["uv", "pip", "install", "--python", str(python), "--no-binary", "llama-cpp-python"]
        + [f"llama-cpp-python=={LLAMA_CPP_VERSION}", "numpy"],
        check=True,
        env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count())},
    )
    return python


def bench_llama_cpp(
    python: Path, gguf: Path, args: argparse.Namespace
) -> tuple[tuple[float, float], np.ndarray]:
    """((prefill, decode) tokens/s, logits after the prompt) of llama.cpp on `gguf`."""
    with tempfile.TemporaryDirectory() as tmp:
        logits_out = Path(tmp) / "logits.npy"
        command = [str(python), __file__, "--llama-cpp-worker", str(gguf)]
        command += ["--prompt-len", str(args.prompt_len), "--decode", str(args.decode)]
        command += ["--reps", str(args.reps), "--seed", str(args.seed)]
        command += ["--logits-out", str(logits_out)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"llama.cpp on {gguf} failed:\n{done.stderr[-2000:]}")
        rates = json.loads(done.stdout.strip().splitlines()[-1])
        return (rates["prefill"], rates["decode"]), np.load(logits_out)


def same_weights_check(name: str, model_dir: Path, prompt: list[int], theirs) -> None:
    """Log how far llama.cpp's logits after the prompt are from ours: the GGUF holds the same
    model (q/k permutation, names, hparams), so they agree up to each side's rounding."""
    import ats_native

    ours = ats_native.Model(str(model_dir), threads=THREADS).logits(prompt)[-1]
    diff = float(np.abs(ours - theirs).max() / np.abs(ours).max())
    same = int(ours.argmax()) == int(theirs.argmax())
    log(
        f"{name}: logits after the prompt, max |ours - llama.cpp| / max|ours| = {diff:.2e}, "
        f"same argmax: {same}"
    )


# ---- report -----------------------------------------------------------------------------------
def emit(name: str, ours: float, baseline: float, hw: str, unit: str = "tokens/s") -> None:
    row = {"name": name, "ours": round(ours, 2), "baseline": round(baseline, 2)}
    row.update(ratio=round(ours / baseline, 3), hardware=hw, unit=unit)
    print(json.dumps(row), flush=True)


def emit_peak_fractions(
    name: str, fields: dict, ours: dict, eager: tuple | None, peak: dict, hw: str
) -> None:
    """Prefill GMAC/s against the measured peak, and what 5x torch eager would need."""
    gmacs = macs_per_token(fields) / 1e9  # per token
    for precision, rates in ours.items():
        kind = PEAK_OF[precision]
        emit(
            f"native/{name}/prefill/ats-{precision}_fraction-of-{kind}-peak",
            rates[0] * gmacs,
            peak[kind] / 1e9,
            hw,
            "GMAC/s",
        )
    if eager is not None:
        emit(
            f"native/{name}/prefill/torch-eager-fp32_fraction-of-fp32-peak",
            eager[0] * gmacs,
            peak["fp32"] / 1e9,
            hw,
            "GMAC/s",
        )
        emit(
            f"native/{name}/prefill/5x-torch-eager_vs_int8-peak",
            5 * eager[0] * gmacs,
            peak["int8"] / 1e9,
            hw,
            "GMAC/s",
        )


def run_model(
    name: str, fields: dict, python: Path | None, peak: dict, args: argparse.Namespace
) -> None:
    import ats_native

    hw = f"{hardware()}, ats kernels {ats_native.cpu_features()['kernels']}"
    paths = prepare(args.cache, name, fields)
    prompt = random_prompt(fields["vocab_size"], args.prompt_len, args.seed)
    if args.batch:
        for precision in args.precisions:
            rates = bench_batched(
                paths[precision]["ats"], prompt, args.batch, args.decode, args.reps, args.kv_cache
            )
            ratios = [many / one for many, one in rates]
            row = {"name": f"native/{name}/decode/ats-{precision}_b{args.batch}-aggregate_vs_b1",
                   "median_ratio": round(statistics.median(ratios), 3),
                   "ratios": [round(r, 3) for r in ratios], "kv_cache": args.kv_cache,
                   "tok_s": [[round(many, 1), round(one, 1)] for many, one in rates],
                   "hardware": hw}  # fmt: skip
            print(json.dumps(row), flush=True)
        return
    ours = {}
    for precision in args.precisions:
        ours[precision] = bench_ats(
            paths[precision]["ats"], prompt, args.decode, args.reps, args.kv_cache
        )
        log(f"{name} ats {precision}: prefill/decode {ours[precision]}")
    eager = None
    if not args.no_torch:
        n_torch = max(4, args.decode // 4)  # eager decode is slow; fewer tokens, same rate
        eager = bench_torch(paths["fp32"]["ats"], prompt, n_torch, args.reps)
        log(f"{name} torch eager fp32: prefill/decode {eager}")
        for precision, rates in ours.items():
            for i, phase in enumerate(("prefill", "decode")):
                emit(
                    f"native/{name}/{phase}/ats-{precision}_vs_torch-eager-fp32",
                    rates[i],
                    eager[i],
                    hw,
                )
    emit_peak_fractions(name, fields, ours, eager, peak, hw)
    if python is not None:
        for precision, rates in ours.items():
            outtype = PRECISIONS[precision][0]
            theirs, logits = bench_llama_cpp(python, paths[precision]["gguf"], args)
            log(f"{name} llama.cpp {outtype}: prefill/decode {theirs}")
            same_weights_check(
                f"{name} {precision}/{outtype}", paths[precision]["ats"], prompt, logits
            )
            for i, phase in enumerate(("prefill", "decode")):
                emit(
                    f"native/{name}/{phase}/ats-{precision}_vs_llama.cpp-{outtype}",
                    rates[i],
                    theirs[i],
                    hw,
                )


def main() -> None:
    device = argparse.ArgumentParser(add_help=False)
    device.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    known, rest = device.parse_known_args()
    if known.device == "cuda":  # the GPU decode benchmark, with its own options
        sys.path.insert(0, str(Path(__file__).parent))
        import native_cuda

        sys.argv = [native_cuda.__file__, *rest]
        native_cuda.main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the GPU decode benchmark of benchmarks/native_cuda.py (its options follow)",
    )
    parser.add_argument("--models", nargs="+", choices=("dense", "moe"), default=["dense", "moe"])
    parser.add_argument(
        "--precisions", nargs="+", choices=tuple(PRECISIONS), default=list(PRECISIONS)
    )
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument(
        "--kv-cache", choices=("f32", "f16"), default="f32", help="ats_native.Model's KV cache type"
    )
    parser.add_argument("--decode", type=int, default=32, help="decode steps measured")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=0, metavar="N",
                        help="instead: N sequences decoding together vs one (ats only, paired "
                        "per rep)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "ats-bench")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch eager baseline")
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp baseline")
    parser.add_argument("--llama-cpp-worker", metavar="GGUF", help=argparse.SUPPRESS)
    parser.add_argument("--logits-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_cpp_worker:
        llama_cpp_worker(args)
        return
    # --batch measures ats alone
    python = (
        None if args.no_llama_cpp or args.batch else ensure_llama_venv(args.cache / "llama-venv")
    )
    start = time.perf_counter()
    import ats_native

    hw = f"{hardware()}, ats kernels {ats_native.cpu_features()['kernels']}"
    peak = measured_peak(3)
    log(f"measured peak GMAC/s on {THREADS} threads: " + str({k: v / 1e9 for k, v in peak.items()}))
    emit(
        "native/cpu-peak/int8-dot_vs_fp32-fma", peak["int8"] / 1e9, peak["fp32"] / 1e9, hw, "GMAC/s"
    )
    for name, fields in model_configs().items():
        if name.split("-")[0] in args.models:
            run_model(name, fields, python, peak, args)
    log(f"done in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
