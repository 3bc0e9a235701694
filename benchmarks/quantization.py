"""Quantization quality and speed (issue 27): for each float model directory given, perplexity
and bits per byte on the stdlib's held-out split (ats-infer eval-ppl's), file size and native
decode tok/s of float, RTN int8, RTN int4 (g32, g128), GPTQ int4 (g128), optimum-quanto
int8/int4 (torch engine) and llama.cpp's Q8_0/Q4_0 of the GGUF export (when --llama-python
names a Python that imports llama_cpp; its perplexity is computed here from its logits).

    # the stdlib's train split, tokenized once (the models are trained on a CUDA device)
    uv run ats-tokenizer train --input $(python -c "from ats_data.sources import open_source; \
        print(' '.join(str(f.path) for f in open_source('stdlib').files))") --vocab-size 2048 \
        --out .qdata/tokenizer.json --special '<|endoftext|>' '<|im_start|>' '<|im_end|>'
    uv run ats-data prepare --source stdlib --tokenizer .qdata/tokenizer.json --out .qdata/stdlib \
        --val-fraction 0.05
    uv run ats-train --config benchmarks/quantization_dense.toml --run-dir runs/qdense   # and _moe
    uv run python benchmarks/quantization.py --model dense=runs/qdense/model --model moe=runs/qmoe/model \
        --work /tmp/quant-bench --seq-len 128 --max-tokens 16384 --threads 2 \
        [--llama-python /path/to/venv/bin/python] [--json out.json] \
        [--decode-rounds 5] [--decode-clock wall|cpu]

Prints a markdown table per model (BENCHMARKS.md) and the goals: int8 within 0.5% of float
perplexity, GPTQ int4 closing >= half of RTN int4's gap (same group size, 128), GPTQ int4 native
decode >= 95% of RTN int4's (the per-round ratio: median and range). A quantized copy already in
--work is reused, not remade. GPTQ calibrates on --calib-samples windows; an MoE block reads up
to experts / top-k times as many, until each expert has been routed as many tokens as a dense
layer sees (ats_infer.gptq_model).
"""

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# This folder's kernels.py would shadow the `kernels` package that transformers (imported by
# optimum-quanto) probes for: keep the script's folder off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import ats_native  # noqa: E402
import numpy as np  # noqa: E402
from ats_infer.corpus import split_documents, token_windows  # noqa: E402
from ats_infer.engine import load_engine  # noqa: E402
from ats_infer.gguf_export import export_gguf  # noqa: E402
from ats_infer.gptq_model import gptq_model_dir  # noqa: E402
from ats_infer.perplexity import evaluate  # noqa: E402
from ats_infer.quantize import quantize_model_dir  # noqa: E402
from ats_infer.quanto_dir import quanto_model_dir  # noqa: E402
from ats_tokenizer import Tokenizer  # noqa: E402

LLAMA_PPL = r"""
import json, sys, numpy as np, llama_cpp
gguf, ids_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = np.load(ids_path)
llm = llama_cpp.Llama(model_path=gguf, n_ctx=ids.shape[1], logits_all=True, verbose=False,
                      n_threads=threads, n_batch=ids.shape[1])
nll = 0.0
for row in ids:
    llm.reset()
    llm.eval(row[:-1].tolist())
    z = np.array(llm.scores[: len(row) - 1], dtype=np.float64)
    peak = z.max(-1, keepdims=True)
    logz = np.log(np.exp(z - peak).sum(-1)) + peak[:, 0]
    nll += float((logz - z[np.arange(len(row) - 1), row[1:]]).sum())
print(json.dumps({"nll": nll}))
"""


def decode_rounds(
    dirs: dict[str, Path], threads: int, rounds: int, clock: str
) -> dict[str, list[float]]:
    """Greedy decode steps per second after a 16-token prompt (prefill and first token
    excluded), one rate per round; the directories take turns within each round, so a busy spell
    of a shared machine slows every variant alike rather than one of them. clock "cpu" counts
    the process's CPU seconds (all threads) instead of wall seconds: on a machine other jobs
    load, time spent waiting for a core then does not count."""
    now = {"wall": time.perf_counter, "cpu": time.process_time}[clock]
    models = {label: ats_native.Model(str(path), threads=threads) for label, path in dirs.items()}
    rates: dict[str, list[float]] = {label: [] for label in models}
    for _ in range(rounds):
        for label, model in models.items():
            tokens = model.generate(list(range(1, 17)), 64, temperature=0.0)
            next(tokens)
            start = now()
            n = sum(1 for _ in tokens)
            rates[label].append(n / (now() - start))
    return rates


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else list(path.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) / 1e6


def llama_row(gguf: Path, windows, python: str, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = Path(tmp) / "ids.npy"
        np.save(ids_path, windows.ids)
        out = subprocess.run(
            [python, "-c", LLAMA_PPL, str(gguf), str(ids_path), str(threads)],
            capture_output=True,
            text=True,
            check=True,
        )
    nll = json.loads(out.stdout.strip().splitlines()[-1])["nll"]
    return {
        "ppl": math.exp(nll / windows.n_tokens),
        "bits_per_byte": nll / math.log(2) / windows.n_bytes,
    }


def bench_model(name: str, src: Path, work: Path, args: argparse.Namespace) -> list[dict]:
    tokenizer = Tokenizer.load(src / "tokenizer.json")
    windows = token_windows(
        tokenizer, split_documents("stdlib", "val"), args.seq_len, args.max_tokens
    )
    variants = [
        ("float", src, "native", lambda out: src),
        ("RTN int8", work / "rtn8", "native", lambda out: quantize_model_dir(src, out, 8)),
        (
            "RTN int4 g32",
            work / "rtn4g32",
            "native",
            lambda out: quantize_model_dir(src, out, 4, 32),
        ),
        (
            "RTN int4 g128",
            work / "rtn4g128",
            "native",
            lambda out: quantize_model_dir(src, out, 4, 128),
        ),
        (
            "GPTQ int4 g128",
            work / "gptq4g128",
            "native",
            lambda out: gptq_model_dir(
                src, out, 4, 128, "stdlib", n_samples=args.calib_samples, seq_len=args.seq_len
            ),
        ),
        ("quanto int8", work / "quanto8", "torch", lambda out: quanto_model_dir(src, out, 8)),
        ("quanto int4", work / "quanto4", "torch", lambda out: quanto_model_dir(src, out, 4)),
    ]
    rows = []
    for label, out, engine_name, make in variants:
        start = time.perf_counter()
        made = not out.exists()  # a copy left by an earlier run is reused (no quantize time)
        path = make(out) if made else out
        seconds = time.perf_counter() - start if made and path != src else None
        engine = load_engine(path, engine_name, threads=args.threads)
        row = {"model": name, "variant": label, "engine": engine_name, **evaluate(engine, windows)}
        row.update(path=str(path), size_mb=size_mb(path), quantize_s=seconds, decode_tok_s=None)
        rows.append(row)
        print(json.dumps(row), flush=True)
    native = {r["variant"]: Path(r["path"]) for r in rows if r["engine"] == "native"}
    for label, rates in decode_rounds(
        native, args.threads, args.decode_rounds, args.decode_clock
    ).items():
        row = next(r for r in rows if r["variant"] == label)
        row.update(decode_tok_s=max(rates), decode_rounds=rates)
    if args.llama_python:
        for outtype in ("q8_0", "q4_0"):
            gguf = work / f"model-{outtype}.gguf"
            if not gguf.exists():
                export_gguf(src, gguf, outtype)
            row = {"model": name, "variant": f"llama.cpp {outtype.upper()}", "engine": "llama.cpp"}
            row.update(llama_row(gguf, windows, args.llama_python, args.threads))
            row.update(size_mb=size_mb(gguf), decode_tok_s=None, tokens=windows.n_tokens)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    float_ppl = rows[0]["ppl"]
    lines = [
        "| variant | engine | ppl | vs float | bits/byte | size MB | native decode tok/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        tok_s = "-" if r["decode_tok_s"] is None else f"{r['decode_tok_s']:.1f}"
        lines.append(
            f"| {r['variant']} | {r['engine']} | {r['ppl']:.3f} | {r['ppl'] / float_ppl - 1:+.2%} "
            f"| {r['bits_per_byte']:.4f} | {r['size_mb']:.1f} | {tok_s} |"
        )
    return "\n".join(lines)


def goals(rows: list[dict]) -> str:
    by = {r["variant"]: r for r in rows}
    f = by["float"]["ppl"]
    rtn_gap = by["RTN int4 g128"]["ppl"] - f
    gptq_gap = by["GPTQ int4 g128"]["ppl"] - f
    closed = 1 - gptq_gap / rtn_gap if rtn_gap > 0 else float("nan")
    # GPTQ / RTN int4 g128 decode rate, paired by round: median and range over the rounds
    ratios = sorted(
        g / r
        for g, r in zip(
            by["GPTQ int4 g128"]["decode_rounds"], by["RTN int4 g128"]["decode_rounds"], strict=True
        )
    )
    return (
        f"RTN int8 {by['RTN int8']['ppl'] / f - 1:+.3%} of float (goal within 0.5%); "
        f"GPTQ int4 g128 closes {closed:.0%} of RTN int4 g128's gap of {rtn_gap:+.3f} "
        f"(goal >= 50%); GPTQ/RTN int4 decode rate per round median {ratios[len(ratios) // 2]:.1%}, "
        f"range {ratios[0]:.1%}-{ratios[-1]:.1%} over {len(ratios)} rounds (goal >= 95%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="NAME=MODEL_DIR")
    parser.add_argument("--work", required=True, help="folder for the quantized copies")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--calib-samples", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-rounds", type=int, default=5, help="best of these is tabled")
    parser.add_argument("--decode-clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--llama-python", default=None)
    parser.add_argument("--json", default=None, help="write every row here")
    args = parser.parse_args()
    all_rows = []
    for spec in args.model:
        name, directory = spec.split("=", 1)
        work = Path(args.work) / name
        work.mkdir(parents=True, exist_ok=True)
        rows = bench_model(name, Path(directory), work, args)
        all_rows += rows
        print(f"\n### {name} ({rows[0]['tokens']} held-out tokens)\n\n{table(rows)}\n")
        print(goals(rows) + "\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(all_rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
