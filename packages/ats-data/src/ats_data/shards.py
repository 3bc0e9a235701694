"""Tokenization into memory-mapped token shards and the index that describes them.

A shard is a flat little-endian array of token ids (uint16 when the vocabulary fits, else
uint32) with the EOS id after every document, named `<split>-00000.bin`. Documents never span
two shards. `index.json` records the format version, tokenizer hash, dtype, and per split the
shards with their token counts, document offsets (start token of each document) and sha256; it
is written last and atomically (temp file + rename), so a crash never leaves a half index.

Tokenization runs in worker processes (each loads the tokenizer from its tokenizer.json path);
results come back in input order, so the shards do not depend on the number of workers.
"""

import hashlib
import json
import multiprocessing
import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from ats_tokenizer import Tokenizer
from ats_tokenizer.hf_json import TokenizerFileError
from ats_tokenizer.inputs import check_input_file, decode_utf8, parse_json
from ats_tokenizer.tokenizer import EOS_TOKEN

from ats_data.errors import DataError

INDEX_NAME = "index.json"
TOKENIZER_NAME = "tokenizer.json"  # a copy of the tokenizer the shards were made with
INDEX_FORMAT = "ats-data/shards"
INDEX_VERSION = 1
SHARD_NAME = re.compile(r"^(train|val)-\d{5}\.bin$")
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
DEFAULT_SHARD_TOKENS = 1 << 27
_CHUNK_DOCS = 128
_CHUNK_CHARS = 1 << 20

_worker_tokenizer: Tokenizer | None = None  # set once per worker process by _init_worker


def token_dtype_name(vocab_size: int) -> str:
    """'uint16' when every id fits in 16 bits (vocab_size <= 65536), else 'uint32'."""
    if vocab_size <= 0 or vocab_size > 1 << 32:
        raise DataError(f"vocab_size must be in [1, 2**32], got {vocab_size}")
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def load_tokenizer(path: Path, expected_sha256: str | None = None) -> Tokenizer:
    """Load an ats_tokenizer.Tokenizer from tokenizer.json, optionally checking its hash (the
    file must not change between the parent's look and a worker's)."""
    try:
        check_input_file(path, "tokenizer")  # missing, a folder, a symlink loop, a device
        tokenizer = Tokenizer.load(path)
    except (OSError, TokenizerFileError) as e:
        raise DataError(str(e)) from None
    if EOS_TOKEN not in tokenizer.special_tokens:
        raise DataError(
            f"tokenizer {path} has no {EOS_TOKEN!r} special token (it has "
            f"{sorted(tokenizer.special_tokens)}); shards end every document with it"
        )
    if expected_sha256 is not None and tokenizer.sha256() != expected_sha256:
        raise DataError(
            f"tokenizer {path} changed during prepare: sha256 {tokenizer.sha256()} "
            f"!= {expected_sha256}"
        )
    return tokenizer


def _encode_documents(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    # encode_ordinary: text that spells a special token ("<|endoftext|>") stays plain text;
    # the only EOS ids in a shard are the document separators added here.
    eos = tokenizer.eos_id
    return [np.array([*tokenizer.encode_ordinary(t), eos], dtype=np.int64) for t in texts]


def _init_worker(tokenizer_path: str, expected_sha256: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load_tokenizer(Path(tokenizer_path), expected_sha256)


def _encode_in_worker(texts: list[str]) -> list[np.ndarray]:
    return _encode_documents(_worker_tokenizer, texts)


def _chunks(docs: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    chars = 0
    for split, text in docs:
        chunk.append((split, text))
        chars += len(text)
        if len(chunk) >= _CHUNK_DOCS or chars >= _CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def check_workers(workers: int) -> None:
    """More workers than 4 per core only wait, and an unbounded count can exhaust the host."""
    cores = os.cpu_count() or 1
    if not 1 <= workers <= 4 * cores:
        raise DataError(
            f"workers must be in [1, {4 * cores}] (4 per core, {cores} cores), got {workers}"
        )


def tokenize_documents(
    docs: Iterable[tuple[str, str]],
    tokenizer_path: Path,
    tokenizer_sha256: str,
    workers: int,
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (split, token ids + EOS) for each (split, text), in input order."""
    check_workers(workers)
    if workers == 1:
        tokenizer = load_tokenizer(tokenizer_path, tokenizer_sha256)
        for chunk in _chunks(docs):
            encoded = _encode_documents(tokenizer, [text for _, text in chunk])
            yield from zip((split for split, _ in chunk), encoded, strict=True)
        return
    # spawn, not fork: the parent may hold threads (torch, the native tokenizer's pool), and
    # forking a threaded process can deadlock in the child.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, _init_worker, (str(tokenizer_path), tokenizer_sha256)) as pool:
        # At most 2 chunks per worker in flight: bounded memory however large the source.
        pending: deque = deque()
        for chunk in _chunks(docs):
            texts = [text for _, text in chunk]
            pending.append(([s for s, _ in chunk], pool.apply_async(_encode_in_worker, (texts,))))
            if len(pending) >= 2 * workers:
                splits, result = pending.popleft()
                yield from zip(splits, result.get(), strict=True)
        while pending:
            splits, result = pending.popleft()
            yield from zip(splits, result.get(), strict=True)


class ShardWriter:
    """Appends documents (token arrays ending in EOS) of one split to shard files of at most
    max_shard_tokens tokens each (a longer document gets a shard of its own)."""

    def __init__(self, out_dir: Path, split: str, dtype_name: str, max_shard_tokens: int) -> None:
        if max_shard_tokens < 1:
            raise DataError(f"max_shard_tokens must be >= 1, got {max_shard_tokens}")
        self.out_dir = out_dir
        self.split = split
        self.dtype = DTYPES[dtype_name]
        self.max_shard_tokens = max_shard_tokens
        self.shards: list[dict] = []
        self.written: list[Path] = []
        self._file = None
        self._docs_written = 0

    def add(self, tokens: np.ndarray) -> None:
        if self._file is not None and self._num_tokens + len(tokens) > self.max_shard_tokens:
            self._finish_shard()
        if self._file is None:
            self._start_shard()
        if len(tokens) == 0 or tokens.min() < 0 or tokens.max() > np.iinfo(self.dtype).max:
            raise DataError(
                f"{self.split} document {self._docs_written}: token ids must be a non-empty "
                f"array in [0, {np.iinfo(self.dtype).max}] for {self.dtype.name}"
            )
        data = tokens.astype(self.dtype).tobytes()
        self._file.write(data)
        self._sha.update(data)
        self._offsets.append(self._num_tokens)
        self._num_tokens += len(tokens)
        self._docs_written += 1

    def close(self) -> list[dict]:
        if self._file is not None:
            self._finish_shard()
        return self.shards

    def _start_shard(self) -> None:
        path = self.out_dir / f"{self.split}-{len(self.shards):05d}.bin"
        self.written.append(path)
        self._file = path.open("wb")
        self._sha = hashlib.sha256()
        self._offsets: list[int] = []
        self._num_tokens = 0

    def _finish_shard(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        self.shards.append(
            {
                "file": self.written[-1].name,
                "num_tokens": self._num_tokens,
                "num_docs": len(self._offsets),
                "sha256": self._sha.hexdigest(),
                "doc_offsets": self._offsets,
            }
        )


def make_index(
    *,
    tokenizer_sha256: str,
    vocab_size: int,
    eos_id: int,
    dtype_name: str,
    shards: dict[str, list[dict]],
    source: str,
    cache_key: str,
    config: dict,
    stats: dict,
) -> dict:
    """The index.json document; `shards` maps each split to its ShardWriter.close() list."""
    return {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "cache_key": cache_key,
        "source": source,
        "tokenizer": {"sha256": tokenizer_sha256, "vocab_size": vocab_size, "eos_id": eos_id},
        "dtype": dtype_name,
        "config": config,
        "stats": stats,
        "splits": {
            split: {
                "num_tokens": sum(sh["num_tokens"] for sh in split_shards),
                "num_docs": sum(sh["num_docs"] for sh in split_shards),
                "shards": split_shards,
            }
            for split, split_shards in shards.items()
        },
    }


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def write_index(out_dir: Path, index: dict) -> Path:
    """Write index.json atomically: a temp file in the same folder, fsync, then rename."""
    path = out_dir / INDEX_NAME
    tmp = out_dir / f".{INDEX_NAME}.tmp-{os.getpid()}"
    try:
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(index, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_index(dataset_dir: Path) -> dict:
    path = Path(dataset_dir) / INDEX_NAME
    if not Path(dataset_dir).is_dir():
        raise DataError(f"dataset folder not found: {dataset_dir}")
    if not path.is_file():
        raise DataError(f"{path} not found (not a prepared dataset, or prepare did not finish)")
    index = parse_json(decode_utf8(path.read_bytes(), str(path), DataError), str(path), DataError)
    if not isinstance(index, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(index).__name__}")
    return index
