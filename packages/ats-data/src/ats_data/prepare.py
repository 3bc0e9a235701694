"""`prepare`: source -> clean -> dedup (exact, optionally MinHash) -> train/val split -> tokenized
shards + index.json, whose stats count what was read, dropped and kept, by licence and source.

The index holds a cache key (source fingerprint, tokenizer sha256, cleaning/split/shard
settings): preparing the same source with the same tokenizer and settings into the same folder
reuses the shards there. The number of workers is not part of the key: the shards do not depend
on it. An --out folder that holds anything but an ats-data dataset is refused unless overwrite:
the shard names are common enough to be someone else's files.
"""

import hashlib
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ats_data.clean import CleanConfig, Cleaner
from ats_data.dataset import ShardDataset
from ats_data.dedup import HASH_ALGOS, Dedup, check_dedup_mode, document_digest
from ats_data.document import Document
from ats_data.errors import DataError
from ats_data.shards import (
    DEFAULT_SHARD_TOKENS,
    INDEX_NAME,
    INDEX_VERSION,
    SHARD_NAME,
    TOKENIZER_NAME,
    ShardWriter,
    check_workers,
    load_tokenizer,
    make_index,
    read_index,
    token_dtype_name,
    tokenize_documents,
    write_index,
)
from ats_data.sources import Source, open_source
from ats_data.split import SPLITS, assign_split, check_val_fraction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareConfig:
    """Every setting that changes the prepared tokens (and so enters the cache key)."""

    val_fraction: float = 0.05
    min_chars: int = 1
    max_chars: int | None = None
    text_field: str = "text"
    hash_algo: str = "sha256"
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    dedup: str = "exact"  # "exact", "minhash" (after exact) or "none"
    repetition_filter: bool = False  # Gopher's repetition filters (repetition.py)
    pii: bool = False  # PII replaced by placeholders (pii.py)

    def clean_config(self) -> CleanConfig:
        return CleanConfig(self.min_chars, self.max_chars, self.repetition_filter, self.pii)

    def __post_init__(self) -> None:
        check_val_fraction(self.val_fraction)
        check_dedup_mode(self.dedup)
        self.clean_config()
        if self.hash_algo not in HASH_ALGOS:
            raise DataError(
                f"hash_algo must be one of {', '.join(HASH_ALGOS)}, got {self.hash_algo!r}"
            )
        if self.shard_tokens < 1:
            raise DataError(f"shard_tokens must be >= 1, got {self.shard_tokens}")


def cache_key(source: Source, tokenizer_sha256: str, config: PrepareConfig) -> str:
    payload = {
        "index_version": INDEX_VERSION,
        "source": source.fingerprint(),
        "tokenizer_sha256": tokenizer_sha256,
        "config": asdict(config),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class _Counts:
    documents_read: int = 0
    dropped_short: int = 0
    dropped_long: int = 0
    dropped_repetition: dict = field(default_factory=dict)  # by the Gopher test failed
    pii_replaced: dict = field(default_factory=dict)  # by kind: email, ip, phone
    duplicates: int = 0
    near_duplicates: int = 0
    skipped: dict = field(default_factory=dict)  # what the corpus readers left out, by reason
    licences: dict = field(default_factory=dict)  # kept documents by licence
    sources: dict = field(default_factory=dict)  # kept documents by reader


def _split_documents(
    source: Source, config: PrepareConfig, counts: _Counts, workers: int
) -> Iterator[tuple[str, str]]:
    cleaner = Cleaner(config.clean_config())
    deduper = Dedup(config.dedup, workers=workers)
    skipped: Counter = Counter()
    licences: Counter = Counter()
    sources: Counter = Counter()

    def cleaned() -> Iterator[Document]:
        for doc in source.documents(skipped, workers):
            counts.documents_read += 1
            text = cleaner(doc.text)
            if text is not None:
                doc.text = text
                yield doc

    for doc in deduper(cleaned()):
        licences[doc.licence or "unknown"] += 1
        sources[doc.source] += 1
        yield (
            assign_split(document_digest(doc.text, config.hash_algo), config.val_fraction),
            doc.text,
        )
    counts.dropped_short = cleaner.dropped_short
    counts.dropped_long = cleaner.dropped_long
    counts.dropped_repetition = dict(sorted(cleaner.dropped_repetition.items()))
    counts.pii_replaced = dict(sorted(cleaner.pii_replaced.items()))
    counts.duplicates = deduper.exact.duplicates
    counts.near_duplicates = deduper.minhash.removed if deduper.minhash else 0
    counts.skipped = dict(sorted(skipped.items()))
    counts.licences = dict(licences.most_common())
    counts.sources = dict(sources.most_common())


def _copy_tokenizer(src: Path, dst: Path) -> None:
    """Keep the tokenizer beside its shards, so a prepared folder is usable on its own."""
    if dst.exists() and dst.samefile(src):
        return
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def prepare(
    source: str | Path | Source,
    tokenizer_path: str | Path,
    out_dir: str | Path,
    *,
    val_fraction: float = 0.05,
    workers: int = 2,
    min_chars: int = 1,
    max_chars: int | None = None,
    text_field: str = "text",
    hash_algo: str = "sha256",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    dedup: str = "exact",
    repetition_filter: bool = False,
    pii: bool = False,
    overwrite: bool = False,
) -> Path:
    """Prepare `source` into token shards in `out_dir` and return `out_dir`. The folder also
    gets a copy of the tokenizer as tokenizer.json.

    If out_dir already holds a dataset with the same cache key it is verified and reused. A
    dataset there with another key, or a non-empty folder that is not an ats-data dataset, is an
    error unless overwrite=True.
    """
    config = PrepareConfig(
        val_fraction,
        min_chars,
        max_chars,
        text_field,
        hash_algo,
        shard_tokens,
        dedup,
        repetition_filter,
        pii,
    )
    check_workers(workers)
    src = source if isinstance(source, Source) else open_source(source, text_field=text_field)
    tokenizer_path = Path(tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_path)
    tok_sha = tokenizer.sha256()
    key = cache_key(src, tok_sha, config)
    out = Path(out_dir)

    if (out / INDEX_NAME).is_file():
        old_key = read_index(out).get("cache_key") if not overwrite else None
        if old_key == key:
            try:
                ShardDataset(out, verify=True)
            except DataError as e:
                raise DataError(f"{e}; prepare again with overwrite=True") from None
            log.info("reusing prepared dataset %s (cache key %s)", out, key[:16])
            return out
        if not overwrite:
            raise DataError(
                f"{out} already holds a dataset prepared from other inputs (cache key "
                f"{str(old_key)[:16]}, this one {key[:16]}); choose another out dir or overwrite"
            )
        (out / INDEX_NAME).unlink()  # first, so a crash below cannot leave a stale index
    elif out.is_dir() and any(out.iterdir()) and not overwrite:
        raise DataError(
            f"out dir {out} is not empty and holds no ats-data dataset ({INDEX_NAME}); choose an "
            "empty or new folder, or overwrite (its train-/val-NNNNN.bin files are replaced)"
        )
    if out.exists() and not out.is_dir():
        raise DataError(f"out dir {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        if SHARD_NAME.match(stale.name):
            stale.unlink()

    dtype_name = token_dtype_name(tokenizer.vocab_size)
    writers = {s: ShardWriter(out, s, dtype_name, config.shard_tokens) for s in SPLITS}
    counts = _Counts()
    try:
        docs = _split_documents(src, config, counts, workers)
        for split, tokens in tokenize_documents(docs, tokenizer_path, tok_sha, workers):
            writers[split].add(tokens)
        shards = {s: w.close() for s, w in writers.items()}
        num_docs = {s: sum(sh["num_docs"] for sh in shards[s]) for s in SPLITS}
        if num_docs["train"] == 0:
            raise DataError(
                f"source {src.spec} left no training documents ({counts.documents_read} read, "
                f"{counts.dropped_short} shorter than {config.min_chars} chars, "
                f"{counts.dropped_long} longer than max_chars, "
                f"{sum(counts.dropped_repetition.values())} repetitive, "
                f"{counts.duplicates} duplicates, "
                f"{num_docs['val']} in val)"
            )
        if config.val_fraction > 0 and num_docs["val"] == 0:
            raise DataError(
                f"source {src.spec} gave no validation documents: {num_docs['train']} documents, "
                f"each in val with probability val_fraction = {config.val_fraction}; use a "
                "source with more documents or a larger val_fraction"
            )
    except BaseException:
        for w in writers.values():
            w.close()
            for path in w.written:
                path.unlink(missing_ok=True)
        raise

    index = make_index(
        tokenizer_sha256=tok_sha,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        dtype_name=dtype_name,
        shards=shards,
        source=src.spec,
        cache_key=key,
        config=asdict(config),
        stats=asdict(counts),
    )
    _copy_tokenizer(tokenizer_path, out / TOKENIZER_NAME)
    write_index(out, index)
    log.info("prepared %s: %s", out, {s: v["num_tokens"] for s, v in index["splits"].items()})
    return out
