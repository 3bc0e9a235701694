"""`ShardDataset`: a prepared dataset folder opened for reading. It validates index.json (format,
version, fields), then every shard (present, size equal to its token count times the dtype
width, document offsets consistent, and with verify=True its sha256 and the EOS after every
document), and memory-maps the shards read-only. Errors name the file and what was expected."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ats_data.errors import DataError
from ats_data.shards import (
    DTYPES,
    INDEX_FORMAT,
    INDEX_NAME,
    INDEX_VERSION,
    read_index,
    sha256_file,
)


def _field(where: str, obj: dict, name: str, kind: type | tuple[type, ...]):
    if name not in obj:
        raise DataError(f"{where}: missing field {name!r}")
    value = obj[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DataError(f"{where}: field {name!r} has type {type(value).__name__}")
    return value


class ShardDataset:
    """A prepared dataset: `shards(split)` gives read-only memmaps of token ids."""

    def __init__(self, path: str | Path, verify: bool = True) -> None:
        self.path = Path(path)
        self.index = read_index(self.path)
        where = str(self.path / INDEX_NAME)
        if self.index.get("format") != INDEX_FORMAT:
            raise DataError(
                f"{where}: format {self.index.get('format')!r}, expected {INDEX_FORMAT!r}"
            )
        if self.index.get("version") != INDEX_VERSION:
            raise DataError(
                f"{where}: version {self.index.get('version')!r}, this ats-data reads {INDEX_VERSION}"
            )
        dtype_name = _field(where, self.index, "dtype", str)
        if dtype_name not in DTYPES:
            raise DataError(f"{where}: dtype {dtype_name!r}, expected one of {sorted(DTYPES)}")
        self.dtype = DTYPES[dtype_name]
        tok = _field(where, self.index, "tokenizer", dict)
        self.tokenizer_sha256: str = _field(where + " tokenizer", tok, "sha256", str)
        self.vocab_size: int = _field(where + " tokenizer", tok, "vocab_size", int)
        self.eos_id: int = _field(where + " tokenizer", tok, "eos_id", int)
        if not 1 <= self.vocab_size <= np.iinfo(self.dtype).max + 1:
            raise DataError(
                f"{where}: vocab_size {self.vocab_size} must be in [1, "
                f"{np.iinfo(self.dtype).max + 1}] (dtype {dtype_name})"
            )
        if not 0 <= self.eos_id < self.vocab_size:
            raise DataError(
                f"{where}: eos_id {self.eos_id} must be in [0, vocab_size {self.vocab_size})"
            )
        splits = _field(where, self.index, "splits", dict)
        self._shards: dict[str, list[np.memmap]] = {}
        self._offsets: dict[str, list[np.ndarray]] = {}
        for split, entry in splits.items():
            if not isinstance(entry, dict):
                raise DataError(f"{where}: split {split!r} is not an object")
            shard_entries = _field(f"{where} split {split!r}", entry, "shards", list)
            maps, offsets = [], []
            for i, shard in enumerate(shard_entries):
                mm, offs = self._open_shard(f"{where} split {split!r} shard {i}", shard, verify)
                maps.append(mm)
                offsets.append(offs)
            self._shards[split] = maps
            self._offsets[split] = offsets

    def _open_shard(self, where: str, shard: object, verify: bool) -> tuple[np.memmap, np.ndarray]:
        if not isinstance(shard, dict):
            raise DataError(f"{where}: not an object")
        name = _field(where, shard, "file", str)
        if Path(name).name != name or name in ("", ".", ".."):
            raise DataError(f"{where}: file {name!r} must be a plain file name")
        num_tokens = _field(where, shard, "num_tokens", int)
        digest = _field(where, shard, "sha256", str)
        offsets_list = _field(where, shard, "doc_offsets", list)
        # checked before numpy sees them: a cast would turn a bool into 0 or 1, a float or an int
        # beyond int64 into an inexact value, or raise without naming the field
        if not offsets_list or not all(type(o) is int and 0 <= o < 2**63 for o in offsets_list):
            raise DataError(
                f"{where}: doc_offsets must be a non-empty list of integers in [0, 2**63)"
            )
        file = self.path / name
        if not file.is_file():
            raise DataError(f"shard {file} not found (listed in {self.path / INDEX_NAME})")
        expected = num_tokens * self.dtype.itemsize
        actual = file.stat().st_size
        if actual != expected or num_tokens <= 0:
            raise DataError(
                f"shard {file} is {actual} bytes, expected {expected} "
                f"({num_tokens} tokens x {self.dtype.itemsize} bytes): truncated or corrupted"
            )
        offsets = np.asarray(offsets_list, dtype=np.int64)
        if offsets[0] != 0 or np.any(np.diff(offsets) <= 0):
            raise DataError(f"{where}: doc_offsets must start at 0 and increase strictly")
        if offsets[-1] >= num_tokens:
            raise DataError(f"{where}: doc_offsets end at {offsets[-1]} >= num_tokens {num_tokens}")
        if verify:
            actual_digest = sha256_file(file)
            if actual_digest != digest:
                raise DataError(
                    f"shard {file} is corrupted: sha256 {actual_digest} != {digest} in the index"
                )
        mm = np.memmap(file, dtype=self.dtype, mode="r")
        if verify:
            ends = np.append(offsets[1:], num_tokens) - 1
            bad = np.flatnonzero(mm[ends] != self.eos_id)
            if len(bad):
                raise DataError(
                    f"shard {file}: document {int(bad[0])} does not end with EOS id {self.eos_id}"
                )
        return mm, offsets

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._shards)

    def _check_split(self, split: str) -> None:
        if split not in self._shards:
            raise DataError(
                f"split {split!r} not in dataset {self.path} (splits: {', '.join(self.splits)})"
            )

    def shards(self, split: str) -> list[np.memmap]:
        """Read-only token memmaps of one split, in order."""
        self._check_split(split)
        return list(self._shards[split])

    def doc_offsets(self, split: str) -> list[np.ndarray]:
        """Per shard, the start token index of each document in it."""
        self._check_split(split)
        return list(self._offsets[split])

    def num_tokens(self, split: str) -> int:
        self._check_split(split)
        return sum(len(m) for m in self._shards[split])

    def num_docs(self, split: str) -> int:
        self._check_split(split)
        return sum(len(o) for o in self._offsets[split])

    def documents(self, split: str) -> Iterator[np.ndarray]:
        """Token ids of each document of a split (EOS included), in order."""
        for mm, offsets in zip(self.shards(split), self.doc_offsets(split), strict=True):
            ends = np.append(offsets[1:], len(mm))
            for start, end in zip(offsets, ends, strict=True):
                yield mm[start:end]
