"""`extract`: a source's cleaned documents (text + id, title, url, licence, source) as JSONL,
without tokenising, after exact or MinHash dedup. The JSONL and its report (`OUT.report.json`:
documents read, what each reader left out, what the length, repetition and PII filters dropped
or replaced, dedup counts, licences) are written to temp names in
the output's folder and renamed into place at the end: an error leaves no partial file."""

import json
import os
from collections import Counter
from pathlib import Path

from ats_data.clean import CleanConfig, Cleaner
from ats_data.dedup import Dedup
from ats_data.errors import DataError
from ats_data.minhash import MinHashConfig
from ats_data.sources import Source, open_source


def check_output_path(out: Path, source: Source, force: bool) -> None:
    """An output may not be one of the inputs, a folder, or an existing file (without force)."""
    inputs = {f.path.resolve() for f in source.files}
    if out.resolve() in inputs:
        raise DataError(f"output {out} is one of the source's input files")
    if out.is_dir():
        raise DataError(f"output {out} is a folder, expected a file name")
    if out.exists() and not force:
        raise DataError(f"output {out} exists; choose another name or pass --force")


def write_atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def extract(
    source: str | Path | Source,
    out: str | Path,
    *,
    dedup: str = "exact",
    workers: int = 1,
    minhash: MinHashConfig | None = None,
    clean: CleanConfig | None = None,
    force: bool = False,
) -> dict:
    """Write the documents of `source` to `out` (JSONL) and return the report."""
    src = source if isinstance(source, Source) else open_source(source)
    out = Path(out)
    check_output_path(out, src, force)
    report_path = out.with_name(out.name + ".report.json")
    counts: Counter = Counter()
    licences: Counter = Counter()
    sources: Counter = Counter()
    deduper = Dedup(dedup, minhash, workers)
    cleaner = Cleaner(clean or CleanConfig())
    read = 0

    def cleaned():
        nonlocal read
        for doc in src.documents(counts, workers):
            read += 1
            text = cleaner(doc.text)
            if text is not None:
                doc.text = text
                yield doc

    def write(f) -> None:
        for doc in deduper(cleaned()):
            licences[doc.licence or "unknown"] += 1
            sources[doc.source] += 1
            f.write(json.dumps(doc.to_json(), ensure_ascii=False))
            f.write("\n")

    if out.parent != Path("") and not out.parent.is_dir():
        raise DataError(f"output folder {out.parent} does not exist")
    write_atomic(out, write)
    report = {
        "source": src.spec,
        "documents_read": read,
        "documents_written": sum(sources.values()),
        "skipped": dict(sorted(counts.items())),
        "dropped_short": cleaner.dropped_short,
        "dropped_long": cleaner.dropped_long,
        "dropped_repetition": dict(sorted(cleaner.dropped_repetition.items())),
        "pii_replaced": dict(sorted(cleaner.pii_replaced.items())),
        "exact_duplicates": deduper.exact.duplicates,
        "minhash": deduper.minhash.to_json() if deduper.minhash else None,
        "licences": dict(licences.most_common()),
        "sources": dict(sources.most_common()),
    }
    write_atomic(report_path, lambda f: json.dump(report, f, indent=1))
    return report
