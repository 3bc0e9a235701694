"""Rows of a JSONL or Parquet file as dicts, each with where it came from (`file:line` for JSONL,
`file:row N` for Parquet): what post-training reads (SFT, DPO and GRPO rows in TRL's formats).

A malformed row is an error naming its file and line, never skipped: a skipped row silently
changes the dataset a run trains on, and one bad line usually means the file is not what the user
thinks it is."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from ats_tokenizer.inputs import parse_json

from ats_data.errors import DataError
from ats_data.sources import JSONL_SUFFIXES, PARQUET_SUFFIXES

_BATCH_ROWS = 1024


@dataclass(frozen=True)
class Record:
    where: str  # "file:line" or "file:row N", for error messages
    row: dict[str, Any]


def read_records(path: str | Path) -> Iterator[Record]:
    """Every row of a .jsonl/.ndjson or .parquet file, in file order; DataError on a bad one."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix in JSONL_SUFFIXES:
        yield from _jsonl_records(path)
    elif path.suffix in PARQUET_SUFFIXES:
        yield from _parquet_records(path)
    else:
        raise DataError(
            f"{path}: expected a .jsonl, .ndjson or .parquet file of rows, got {path.suffix!r}"
        )


def _jsonl_records(path: Path) -> Iterator[Record]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not UTF-8 text (column {e.start + 1})") from None
            if not line.strip():
                continue
            row = parse_json(line.rstrip("\r\n"), str(path), DataError, line=lineno)
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield Record(where, row)


def _parquet_records(path: Path) -> Iterator[Record]:
    try:
        pf = pq.ParquetFile(path, memory_map=True)
    except pa.ArrowException as e:
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    index = 0
    for batch in pf.iter_batches(batch_size=_BATCH_ROWS):
        for row in batch.to_pylist():
            yield Record(f"{path}:row {index}", row)
            index += 1
