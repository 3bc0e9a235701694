"""`extract` on datatrove's executors (local processes, Slurm, Ray), for corpora beyond one
machine. Three stages over a work folder (any datatrove DataFolder: local path, s3://, ...):

    read (N tasks)       CorpusReader -> CleanFilter -> KeyWriter
                         docs/R.jsonl (extract's records), digests/R.bin, signatures/R.bin
    decide (1 task)      DedupDecider: exact then MinHash (ats_data.minhash) over every task's
                         keys in rank order -> keep/R.bin
    write (N tasks)      KeptWriter -> out/R.jsonl, the kept records

Task R reads a contiguous share of the source's units (a file; one bz2 stream of a multistream
Wikipedia dump; all of PubMed, whose later files update earlier ones), so rank order is input
order and the decider sees the documents in the order single-machine extract does: the output
is the same documents, in the same order, with the same report (`merge`)."""

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datatrove.data import Document as DTDocument
from datatrove.executor import LocalPipelineExecutor
from datatrove.io import DataFolder, get_datafolder
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters.base_filter import BaseFilter

from ats_data.clean import CleanConfig, Cleaner
from ats_data.corpora import wikipedia
from ats_data.dedup import ExactDeduper, check_dedup_mode, document_digest
from ats_data.document import Document
from ats_data.errors import DataError
from ats_data.extract import check_output_path, write_atomic
from ats_data.minhash import MinHashConfig, MinHashDeduper, signatures_of_texts
from ats_data.sources import Source, SourceFile, open_source

_DIGEST_BYTES = 32
_SIGNATURE_BATCH = 256  # documents whose signatures are computed together


@dataclass(frozen=True)
class Unit:
    """The smallest share of a source one task reads: files read together, or (offset set) one
    bz2 stream of a multistream Wikipedia dump."""

    files: tuple[SourceFile, ...]
    offset: int | None = None
    base_url: str = ""

    def documents(self, counts: Counter) -> Iterator[Document]:
        if self.offset is None:
            return Source("", self.files).documents(counts)
        return wikipedia.read_stream(self.files[0].path, self.offset, counts, self.base_url)


def plan_units(source: Source) -> list[Unit]:
    """The source's units in input order."""
    units: list[Unit] = []
    pubmed = [f for f in source.files if f.kind == "pubmed"]
    for f in source.files:
        if f.kind == "pubmed":
            if f is pubmed[0]:
                units.append(Unit(tuple(pubmed)))
            continue
        index = wikipedia.multistream_index(f.path) if f.kind == "wikipedia" else None
        if index is None:
            units.append(Unit((f,)))
            continue
        base_url = wikipedia.site_base_url(f.path)
        units.extend(Unit((f,), off, base_url) for off in wikipedia.multistream_offsets(index))
    return units


def task_share(n_units: int, rank: int, world_size: int) -> range:
    """The contiguous units of task `rank`: shares differ in size by at most one."""
    return range(rank * n_units // world_size, (rank + 1) * n_units // world_size)


def _name(rank: int, ext: str) -> str:
    return f"{rank:05d}.{ext}"


def _write_json(folder: DataFolder, path: str, obj: dict) -> None:
    with folder.open(path, "w") as f:
        json.dump(obj, f)


def _to_datatrove(doc: Document) -> DTDocument:
    meta = {"source": doc.source, "title": doc.title, "url": doc.url, "licence": doc.licence}
    if doc.meta:
        meta["meta"] = doc.meta
    return DTDocument(text=doc.text, id=doc.id, metadata=meta)


def _record(doc: DTDocument) -> dict:
    """The record extract writes (Document.to_json) for a document from CorpusReader."""
    m = doc.metadata
    ours = Document(doc.text, m["source"], doc.id, m["title"], m["url"], m["licence"])
    ours.meta = m.get("meta", {})
    return ours.to_json()


class CorpusReader(PipelineStep):
    """Reads task rank's share of an ats-data source spec (see ats_data.sources.open_source);
    what the readers leave out goes to stats/read/R.json."""

    name = "ats-data reader"
    type = "📖 - READER"

    def __init__(self, source: str, work_dir: str, text_field: str = "text") -> None:
        super().__init__()
        self.source = source
        self.text_field = text_field
        self.work = get_datafolder(work_dir)

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> Iterator[DTDocument]:
        units = plan_units(open_source(self.source, text_field=self.text_field))
        counts: Counter = Counter()
        read = 0
        for i in task_share(len(units), rank, world_size):
            for doc in units[i].documents(counts):
                read += 1
                self.stat_update("documents")
                yield _to_datatrove(doc)
        stats = {"documents_read": read, "skipped": dict(counts)}
        _write_json(self.work, f"stats/read/{_name(rank, 'json')}", stats)


class CleanFilter(BaseFilter):
    """ats_data.clean.Cleaner as a datatrove filter: cleans the text in place (control
    characters, NFC, optional PII), drops by length and Gopher repetition; counts to
    stats/clean/R.json."""

    name = "ats-data clean"

    def __init__(self, config: CleanConfig, work_dir: str) -> None:
        super().__init__()
        self.config = config
        self.work = get_datafolder(work_dir)
        self.cleaner = Cleaner(config)

    def filter(self, doc: DTDocument) -> bool | tuple[bool, str]:
        text = self.cleaner(doc.text)
        if text is None:
            return False, "dropped by ats-data length/repetition filters"
        doc.text = text
        return True

    def run(self, data, rank: int = 0, world_size: int = 1) -> Iterator[DTDocument]:
        yield from super().run(data, rank, world_size)
        c = self.cleaner
        stats = {
            "dropped_short": c.dropped_short,
            "dropped_long": c.dropped_long,
            "dropped_repetition": dict(c.dropped_repetition),
            "pii_replaced": dict(c.pii_replaced),
        }
        _write_json(self.work, f"stats/clean/{_name(rank, 'json')}", stats)


class KeyWriter(PipelineStep):
    """Writes each document's record (docs/R.jsonl), its sha256 digest (digests/R.bin) and, for
    dedup "minhash", its MinHash signature (signatures/R.bin, num_perm uint32 each)."""

    name = "ats-data keys"
    type = "💽 - WRITER"

    def __init__(self, work_dir: str, dedup: str, minhash: MinHashConfig | None = None) -> None:
        super().__init__()
        check_dedup_mode(dedup)
        self.work = get_datafolder(work_dir)
        self.minhash = (minhash or MinHashConfig()) if dedup == "minhash" else None

    def run(self, data, rank: int = 0, world_size: int = 1) -> None:
        docs = self.work.open(f"docs/{_name(rank, 'jsonl')}", "w", encoding="utf-8")
        digests = self.work.open(f"digests/{_name(rank, 'bin')}", "wb")
        sigs = self.work.open(f"signatures/{_name(rank, 'bin')}", "wb")
        batch: list[str] = []
        with docs, digests, sigs:
            for doc in data or ():
                docs.write(json.dumps(_record(doc), ensure_ascii=False) + "\n")
                digests.write(document_digest(doc.text))
                if self.minhash is not None:
                    batch.append(doc.text)
                    if len(batch) == _SIGNATURE_BATCH:
                        sigs.write(signatures_of_texts(batch, self.minhash).tobytes())
                        batch = []
            if batch:
                sigs.write(signatures_of_texts(batch, self.minhash).tobytes())


def _read_bytes(folder: DataFolder, path: str) -> bytes:
    with folder.open(path, "rb") as f:
        return f.read()


class DedupDecider(PipelineStep):
    """One task over all `tasks` ranks' keys, in rank order: exact dedup, then (mode "minhash")
    ats_data.minhash's LSH with its Jaccard check on the exact-unique documents, as extract's
    Dedup does. Writes keep/R.bin (one byte per document) and stats/dedup.json."""

    name = "ats-data dedup"
    type = "🫂 - DEDUP"

    def __init__(
        self, work_dir: str, tasks: int, dedup: str, minhash: MinHashConfig | None = None
    ) -> None:
        super().__init__()
        check_dedup_mode(dedup)
        self.work = get_datafolder(work_dir)
        self.tasks = tasks
        self.dedup = dedup
        self.minhash = (minhash or MinHashConfig()) if dedup == "minhash" else None

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> None:
        exact = ExactDeduper()
        near = MinHashDeduper(self.minhash) if self.minhash is not None else None
        for r in range(self.tasks):
            raw = _read_bytes(self.work, f"digests/{_name(r, 'bin')}")
            digests = [raw[i : i + _DIGEST_BYTES] for i in range(0, len(raw), _DIGEST_BYTES)]
            sigs = None
            if near is not None:
                buf = _read_bytes(self.work, f"signatures/{_name(r, 'bin')}")
                sigs = np.frombuffer(buf, dtype=np.uint32).reshape(-1, near.config.num_perm)
                if len(sigs) != len(digests):
                    raise DataError(
                        f"engine work folder: task {r} has {len(digests)} digests but "
                        f"{len(sigs)} signatures"
                    )
            keep = bytearray(len(digests))
            for i, digest in enumerate(digests):
                if self.dedup == "none":
                    keep[i] = 1
                elif exact.add(digest):
                    keep[i] = 1 if sigs is None else near.add(sigs[i])
            with self.work.open(f"keep/{_name(r, 'bin')}", "wb") as f:
                f.write(bytes(keep))
        stats = {
            "exact_duplicates": exact.duplicates,
            "minhash": near.report.to_json() if near is not None else None,
        }
        _write_json(self.work, "stats/dedup.json", stats)


class KeptWriter(PipelineStep):
    """Copies the kept records of rank's docs/R.jsonl to out/R.jsonl; counts licences and
    sources to stats/write/R.json."""

    name = "ats-data kept"
    type = "💽 - WRITER"

    def __init__(self, work_dir: str) -> None:
        super().__init__()
        self.work = get_datafolder(work_dir)

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> None:
        keep = _read_bytes(self.work, f"keep/{_name(rank, 'bin')}")
        licences: Counter = Counter()
        sources: Counter = Counter()
        n = 0
        src = self.work.open(f"docs/{_name(rank, 'jsonl')}", "r", encoding="utf-8")
        dst = self.work.open(f"out/{_name(rank, 'jsonl')}", "w", encoding="utf-8")
        with src, dst:
            for n, line in enumerate(src, start=1):
                if n > len(keep):
                    break
                if keep[n - 1]:
                    record = json.loads(line)
                    licences[record["licence"] or "unknown"] += 1
                    sources[record["source"]] += 1
                    dst.write(line)
        if n != len(keep):
            raise DataError(
                f"engine work folder: task {rank} has {n} documents but {len(keep)} keep flags"
            )
        _write_json(
            self.work,
            f"stats/write/{_name(rank, 'json')}",
            {"licences": licences, "sources": sources},
        )


@dataclass(frozen=True)
class Stages:
    """The three stages' pipelines; run them in order on any datatrove executor, the middle one
    with a single task."""

    read: list
    decide: list
    write: list


def build_stages(
    source: str,
    work_dir: str,
    tasks: int,
    *,
    dedup: str = "exact",
    minhash: MinHashConfig | None = None,
    clean: CleanConfig | None = None,
    text_field: str = "text",
) -> Stages:
    check_dedup_mode(dedup)
    if tasks < 1:
        raise DataError(f"tasks must be >= 1, got {tasks}")
    return Stages(
        read=[
            CorpusReader(source, work_dir, text_field),
            CleanFilter(clean or CleanConfig(), work_dir),
            KeyWriter(work_dir, dedup, minhash),
        ],
        decide=[DedupDecider(work_dir, tasks, dedup, minhash)],
        write=[KeptWriter(work_dir)],
    )


def _sum_counts(dicts: list[dict]) -> dict:
    total: Counter = Counter()
    for d in dicts:
        total.update(d)
    return total


def merge(work_dir: str, tasks: int, out: Path, spec: str) -> dict:
    """out/R.jsonl of every task, in rank order, into `out` (written atomically) with extract's
    report beside it (OUT.report.json)."""
    work = get_datafolder(work_dir)

    def stats(kind: str) -> list[dict]:
        return [
            json.loads(_read_bytes(work, f"stats/{kind}/{_name(r, 'json')}")) for r in range(tasks)
        ]

    read, clean, written = stats("read"), stats("clean"), stats("write")
    dedup = json.loads(_read_bytes(work, "stats/dedup.json"))

    def copy(f) -> None:
        for r in range(tasks):
            with work.open(f"out/{_name(r, 'jsonl')}", "r", encoding="utf-8") as part:
                shutil.copyfileobj(part, f)

    write_atomic(out, copy)
    sources = _sum_counts([w["sources"] for w in written])
    report = {
        "source": spec,
        "documents_read": sum(r["documents_read"] for r in read),
        "documents_written": sum(sources.values()),
        "skipped": dict(sorted(_sum_counts([r["skipped"] for r in read]).items())),
        "dropped_short": sum(c["dropped_short"] for c in clean),
        "dropped_long": sum(c["dropped_long"] for c in clean),
        "dropped_repetition": dict(
            sorted(_sum_counts([c["dropped_repetition"] for c in clean]).items())
        ),
        "pii_replaced": dict(sorted(_sum_counts([c["pii_replaced"] for c in clean]).items())),
        "exact_duplicates": dedup["exact_duplicates"],
        "minhash": dedup["minhash"],
        "licences": dict(_sum_counts([w["licences"] for w in written]).most_common()),
        "sources": dict(sources.most_common()),
    }
    report_path = out.with_name(out.name + ".report.json")
    write_atomic(report_path, lambda f: json.dump(report, f, indent=1))
    return report


def extract_local(
    source: str,
    out: str | Path,
    *,
    tasks: int,
    workers: int = 1,
    dedup: str = "exact",
    minhash: MinHashConfig | None = None,
    clean: CleanConfig | None = None,
    force: bool = False,
) -> dict:
    """extract through LocalPipelineExecutor: `tasks` shares run by `workers` processes, in a
    work folder beside `out` that is removed afterwards."""
    if tasks < 1:
        raise DataError(f"tasks must be >= 1, got {tasks}")
    out = Path(out)
    src = open_source(source)
    check_output_path(out, src, force)
    if out.parent != Path("") and not out.parent.is_dir():
        raise DataError(f"output folder {out.parent} does not exist")
    if workers < 1:
        raise DataError(f"workers must be >= 1, got {workers}")
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.engine-", dir=out.parent or "."))
    try:
        stages = build_stages(
            str(source), str(work), tasks, dedup=dedup, minhash=minhash, clean=clean
        )
        logs = work / "logs"
        read = LocalPipelineExecutor(
            stages.read, tasks=tasks, workers=workers, logging_dir=str(logs / "read")
        )
        decide = LocalPipelineExecutor(
            stages.decide, tasks=1, workers=1, logging_dir=str(logs / "decide"), depends=read
        )
        write = LocalPipelineExecutor(
            stages.write,
            tasks=tasks,
            workers=workers,
            logging_dir=str(logs / "write"),
            depends=decide,
        )
        write.run()
        return merge(str(work), tasks, out, src.spec)
    finally:
        shutil.rmtree(work)
