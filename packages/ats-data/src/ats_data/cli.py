"""The `ats-data` command: `prepare` a source into token shards, `extract` its cleaned documents
as JSONL, `info` on a prepared folder.
Bad input ends with one line on stderr and exit status 1 (2 for bad command-line usage)."""

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from ats_data import download
from ats_data.clean import CleanConfig
from ats_data.dataset import ShardDataset
from ats_data.dedup import DEDUP_MODES
from ats_data.errors import DataError
from ats_data.extract import extract
from ats_data.prepare import prepare
from ats_data.shards import DEFAULT_SHARD_TOKENS, check_workers
from ats_data.sources import open_source


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-chars", type=int, default=1)
    p.add_argument("--max-chars", type=int, default=None)
    p.add_argument(
        "--repetition-filter",
        action="store_true",
        help="drop documents failing Gopher's repetition tests (Rae et al. 2021 thresholds)",
    )
    p.add_argument(
        "--pii", action="store_true", help="replace e-mails, public IPs and phone numbers"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ats-data", description="Prepare text into token shards and inspect them."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="clean, dedup, split and tokenize a source into shards")
    p.add_argument(
        "--source",
        required=True,
        help="text file, folder, glob, .jsonl, .parquet, .arrow, 'stdlib' / 'stdlib:PACKAGE', or "
        "'pyenv' (this environment's .py/.md/.rst files), or a corpus dump: wikipedia:PATH, arxiv[CATEGORIES]:PATH, stackexchange[SITES]:PATH, "
        "gutenberg:PATH, pubmed:PATH",
    )
    p.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.05,
        help="share of documents held out for validation, in [0, 1); 0: no val documents",
    )
    p.add_argument("--workers", type=int, default=2, help="tokenizer worker processes")
    _add_filters(p)
    p.add_argument("--text-field", default="text", help="JSONL field / Parquet column")
    p.add_argument("--hash", dest="hash_algo", choices=("sha256", "blake2b"), default="sha256")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS)
    p.add_argument("--dedup", choices=DEDUP_MODES, default="exact", help="minhash: after exact")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset already in --out, or write into a non-empty folder that is not one",
    )
    e = sub.add_parser("extract", help="clean and dedup a source into JSONL (no tokenising)")
    e.add_argument("--source", required=True, help="as for prepare, e.g. wikipedia:DUMP.xml.bz2")
    e.add_argument("--out", required=True, type=Path, help="output FILE.jsonl")
    e.add_argument("--dedup", choices=DEDUP_MODES, default="exact")
    _add_filters(e)
    e.add_argument("--workers", type=int, default=1, help="processes for conversion and MinHash")
    e.add_argument(
        "--engine",
        choices=("local",),
        default=None,
        help="run on datatrove's LocalPipelineExecutor (--tasks shares, --workers processes); "
        "Slurm and Ray: build ats_data.engine.build_stages (README)",
    )
    e.add_argument("--tasks", type=int, default=None, help="--engine: shares of the source")
    e.add_argument("--force", action="store_true", help="replace an existing --out file")
    d = sub.add_parser("download", help="fetch a published dump (resumable, checksum-verified)")
    d.add_argument("corpus", choices=("wikipedia", "pubmed", "gutenberg"))
    d.add_argument("--out", required=True, type=Path, help="output folder")
    d.add_argument("--lang", default="en", help="wikipedia: language code")
    d.add_argument("--date", default="latest", help="wikipedia: dump date YYYYMMDD or latest")
    d.add_argument("--set", dest="pubmed_set", default="baseline", help="baseline|updatefiles")
    d.add_argument("--limit", type=int, default=None, help="pubmed: the first N files only")
    d.add_argument("--ids", default="", help="gutenberg: ebook numbers, comma-separated")
    d.add_argument("--mirror", default=None, help="base URL of a mirror of the publisher's site")
    d.add_argument("--retries", type=int, default=5)
    i = sub.add_parser("info", help="validate a prepared folder and summarize it")
    i.add_argument("dir", type=Path)
    i.add_argument("--no-verify", action="store_true", help="skip the sha256 check of shards")
    return parser


def _summary(ds: ShardDataset, verified: bool) -> str:
    lines = [
        f"dataset    {ds.path}",
        f"source     {ds.index.get('source')}",
        f"tokenizer  sha256 {ds.tokenizer_sha256}  vocab_size {ds.vocab_size}  eos_id {ds.eos_id}",
        f"dtype      {ds.dtype.name}",
    ]
    for split in ds.splits:
        n_shards = len(ds.shards(split))
        lines.append(
            f"{split:<10} {ds.num_docs(split)} docs  {ds.num_tokens(split)} tokens  "
            f"{n_shards} shard{'s' if n_shards != 1 else ''}"
        )
    lines.append("verified   sha256 of every shard" if verified else "verified   sizes only")
    return "\n".join(lines)


def _download(args: argparse.Namespace) -> list[Path]:
    kw: dict = {"retries": args.retries}
    if args.mirror:
        kw["mirror"] = args.mirror
    if args.corpus == "wikipedia":
        return download.wikipedia(args.lang, args.date, args.out, **kw)
    if args.corpus == "pubmed":
        return download.pubmed(args.pubmed_set, args.out, args.limit, **kw)
    ids = [s.strip() for s in args.ids.split(",") if s.strip()]
    if not ids or not all(s.isdigit() for s in ids):
        raise DataError(f"gutenberg needs --ids with ebook numbers like 1342,84, got {args.ids!r}")
    return download.gutenberg([int(s) for s in ids], args.out, **kw)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "download":
            for path in _download(args):
                print(path)
        elif args.command == "extract":
            check_workers(args.workers)
            clean = CleanConfig(args.min_chars, args.max_chars, args.repetition_filter, args.pii)
            if args.tasks is not None and args.engine is None:
                raise DataError("--tasks needs --engine local")
            run = extract
            if args.engine == "local":
                from ats_data.engine import extract_local  # datatrove: the engine extra

                run = partial(extract_local, tasks=2 if args.tasks is None else args.tasks)
            report = run(
                args.source,
                args.out,
                dedup=args.dedup,
                workers=args.workers,
                clean=clean,
                force=args.force,
            )
            print(json.dumps(report, indent=1))
        elif args.command == "prepare":
            source = open_source(args.source, text_field=args.text_field)
            out = prepare(
                source,
                args.tokenizer,
                args.out,
                val_fraction=args.val_fraction,
                workers=args.workers,
                min_chars=args.min_chars,
                max_chars=args.max_chars,
                text_field=args.text_field,
                hash_algo=args.hash_algo,
                shard_tokens=args.shard_tokens,
                dedup=args.dedup,
                repetition_filter=args.repetition_filter,
                pii=args.pii,
                overwrite=args.overwrite,
            )
            print(f"read       {source.describe()}")
            print(_summary(ShardDataset(out, verify=False), verified=True))
        else:
            print(_summary(ShardDataset(args.dir, verify=not args.no_verify), not args.no_verify))
    except (DataError, OSError) as e:
        print(f"ats-data: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
