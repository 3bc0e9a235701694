"""Tokenizer benchmark: BPE training time (32k vocab) vs HF `tokenizers`, and batch-encode MB/s on
2 threads vs HF `tokenizers` and `tiktoken`, all on the Python standard library's .py files.

ATS trains through the public `ats_tokenizer.Tokenizer.train` (native backend); HF encodes with
ATS's saved tokenizer.json and tiktoken with `Tokenizer.to_tiktoken()`, so the three share one
vocabulary and pattern and must produce identical ids (mismatches are counted and printed).

Prints one JSON line per measurement: {"name", "ours", "baseline", "ratio", "hardware", "unit"},
where ratio is the speed-up of ATS over the baseline (> 1: ATS is faster), then a summary.
Run: uv run --no-sync python benchmarks/tokenizer.py [--reps 3]
"""

import argparse
import json
import os
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "2")  # HF tokenizers' thread pool, read at import

import ats_native  # noqa: E402
from ats_tokenizer import Tokenizer as AtsTokenizer  # noqa: E402
from ats_tokenizer.pretokenize import GPT4_PATTERN  # noqa: E402
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

VOCAB_SIZE = 32_000
SPECIAL = "<|endoftext|>"
MIN_FREQUENCY = 2
THREADS = 2


def hardware() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{model}, {os.cpu_count()} cores"


def stdlib_texts() -> list[str]:
    """Every .py file of the standard library (site-packages excluded), decoded with replacement."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return [p.read_bytes().decode("utf-8", errors="replace") for p in files]


def median_time(fn: Callable[[], object], reps: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def train_ats(texts: list[str]) -> AtsTokenizer:
    return AtsTokenizer.train(
        texts,
        VOCAB_SIZE,
        min_frequency=MIN_FREQUENCY,
        special_tokens=(SPECIAL,),
        backend="native",
    )


def hf_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(GPT4_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def train_hf(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = hf_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=MIN_FREQUENCY,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def emit(name: str, ours: float, baseline: float, speedup: float, unit: str) -> dict:
    row = {
        "name": name,
        "ours": round(ours, 3),
        "baseline": round(baseline, 3),
        "ratio": round(speedup, 3),
        "hardware": hardware(),
        "unit": unit,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions; the median is reported")
    args = parser.parse_args()
    texts = stdlib_texts()
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# {len(texts)} files, {mb:.1f} MB, {hardware()}, {when}")

    t_ats, tok = median_time(lambda: train_ats(texts), args.reps)
    t_hf, _ = median_time(lambda: train_hf(texts), args.reps)
    emit("train_bpe_32k_stdlib_vs_hf", t_ats, t_hf, t_hf / t_ats, "s")

    with tempfile.TemporaryDirectory() as tmp:
        tok.save(Path(tmp) / "tokenizer.json")
        hf = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    tik = tok.to_tiktoken()
    native = ats_native.BpeEncoder(list(tok.byte_ids), list(tok.merges), "gpt4")
    t_native, ids_native = median_time(
        lambda: native.encode_batch(texts, threads=THREADS), args.reps
    )
    t_ats_enc, ids_ats = median_time(
        lambda: tok.encode_batch(texts, num_threads=THREADS), args.reps
    )
    t_hf_enc, enc_hf = median_time(
        lambda: hf.encode_batch(texts, add_special_tokens=False), args.reps
    )
    t_tik, ids_tik = median_time(
        lambda: tik.encode_ordinary_batch(texts, num_threads=THREADS), args.reps
    )
    ids_hf = [e.ids for e in enc_hf]
    mismatch = {
        name: sum(a != b for a, b in zip(ids_native, other, strict=True))
        for name, other in (("ats_tokenizer", ids_ats), ("hf", ids_hf), ("tiktoken", ids_tik))
    }
    emit(
        "encode_batch_2t_stdlib_native_vs_tiktoken",
        mb / t_native,
        mb / t_tik,
        t_tik / t_native,
        "MB/s",
    )
    emit(
        "encode_batch_2t_stdlib_tokenizer_vs_tiktoken",
        mb / t_ats_enc,
        mb / t_tik,
        t_tik / t_ats_enc,
        "MB/s",
    )
    emit(
        "encode_batch_2t_stdlib_native_vs_hf",
        mb / t_native,
        mb / t_hf_enc,
        t_hf_enc / t_native,
        "MB/s",
    )
    n_tokens = sum(len(ids) for ids in ids_native)
    print(f"# merges learned: {len(tok.merges)}; tokens: {n_tokens}")
    print(f"# texts whose ids differ from ats_native's (of {len(texts)}): {mismatch}")
    train_ok = t_ats <= 2 * t_hf
    print(
        f"# train: ATS {t_ats:.2f} s vs HF {t_hf:.2f} s (goal: <= 2x HF) -> {'met' if train_ok else 'NOT met'}"
    )
    encode_ok = max(t_native, t_ats_enc) <= t_tik
    print(
        f"# encode: ats_native {mb / t_native:.1f} MB/s, ats_tokenizer.Tokenizer "
        f"{mb / t_ats_enc:.1f} MB/s, HF {mb / t_hf_enc:.1f} MB/s, tiktoken {mb / t_tik:.1f} MB/s "
        f"(goal: >= tiktoken) -> {'met' if encode_ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
