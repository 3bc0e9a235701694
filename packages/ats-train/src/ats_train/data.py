"""The data a run trains on: data.source resolved to a prepared shard directory plus its tokenizer.

A prepared directory (one holding index.json) is used as is. A raw source (text file, folder,
glob, JSONL, Parquet, "stdlib") is cut to data.max_bytes of whole files, a tokenizer is trained
on it unless data.tokenizer names one, and it is prepared into data.cache_dir keyed by source
fingerprint and tokenizer hash, so a second run on the same inputs reuses both.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ats_data import ShardDataset, prepare
from ats_data.errors import DataError
from ats_data.loader import TokenLoader
from ats_data.shards import INDEX_NAME
from ats_data.sources import Source, open_source
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS

from ats_train.batch_geometry import BatchGeometry
from ats_train.config import DataSection, TrainConfig

TOKENIZER_FILE = "tokenizer.json"


@dataclass
class TrainData:
    dataset: ShardDataset
    tokenizer: Tokenizer
    tokenizer_path: Path
    shard_dir: Path
    note: str  # what was used, printed at start (a source cut by data.max_bytes says so)

    @property
    def vocab_size(self) -> int:
        return self.dataset.vocab_size


def is_prepared_dir(path: Path) -> bool:
    return path.is_dir() and (path / INDEX_NAME).is_file()


def sliced_source(spec: str, max_bytes: int | None) -> tuple[Source, str]:
    """The source cut to its first whole files totalling at most max_bytes (at least one file),
    and a line saying how much of it that is."""
    source = open_source(spec)
    sizes = [f.path.stat().st_size for f in source.files]
    n = len(sizes)
    if max_bytes is not None:
        total, n = 0, 0
        while n < len(sizes) and (n == 0 or total + sizes[n] <= max_bytes):
            total += sizes[n]
            n += 1
    note = f"{spec}: {n} files, {sum(sizes[:n]) / 1e6:.1f} MB"
    if n < len(sizes):
        note += f" of {len(sizes)} files, {sum(sizes) / 1e6:.1f} MB (data.max_bytes = {max_bytes})"
    return Source(source.spec, source.files[:n]), note


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def train_tokenizer(source: Source, vocab_size: int, cache_dir: Path) -> Path:
    """A byte-level BPE trained on `source`, cached under cache_dir/tokenizers/<key>/. It
    reserves the ChatML special tokens, so every model ats-train pretrains can be chat-tuned."""
    key = _key(source.fingerprint(), vocab_size, CHAT_SPECIAL_TOKENS)
    path = cache_dir / "tokenizers" / key / TOKENIZER_FILE
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.train(iter(source), vocab_size, special_tokens=CHAT_SPECIAL_TOKENS)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tokenizer.save(tmp)
    os.replace(tmp, path)  # another run racing on the same key writes the same bytes
    return path


def build_data(data: DataSection) -> TrainData:
    """Resolve data.source and data.tokenizer; FileNotFoundError / DataError name what is wrong."""
    cache_dir = Path(data.cache_dir).expanduser()
    source_path = Path(data.source)
    if is_prepared_dir(source_path):
        shard_dir = source_path
        note = f"prepared dataset {shard_dir}"
        tokenizer_path = Path(data.tokenizer) if data.tokenizer else shard_dir / TOKENIZER_FILE
        if not tokenizer_path.is_file():
            raise FileNotFoundError(
                f"data.source {shard_dir} is a prepared dataset without {TOKENIZER_FILE}; "
                f"set data.tokenizer to the tokenizer.json it was prepared with"
            )
    else:
        source, note = sliced_source(data.source, data.max_bytes)
        if data.tokenizer is not None:
            tokenizer_path = Path(data.tokenizer)
            if not tokenizer_path.is_file():
                raise FileNotFoundError(f"data.tokenizer {tokenizer_path} does not exist")
        else:
            tokenizer_path = train_tokenizer(source, data.vocab_size, cache_dir)
        sha = Tokenizer.load(tokenizer_path).sha256()
        key = _key(source.fingerprint(), sha, data.val_fraction)
        shard_dir = cache_dir / "shards" / key
        workers = data.workers or os.cpu_count() or 1
        prepare(source, tokenizer_path, shard_dir, val_fraction=data.val_fraction, workers=workers)
    dataset = ShardDataset(shard_dir)
    tokenizer = Tokenizer.load(tokenizer_path)
    if tokenizer.sha256() != dataset.tokenizer_sha256:
        raise DataError(
            f"tokenizer {tokenizer_path} (sha256 {tokenizer.sha256()[:12]}...) is not the one "
            f"{shard_dir} was prepared with (sha256 {dataset.tokenizer_sha256[:12]}...)"
        )
    note = (
        f"data: {note}; {dataset.num_tokens('train'):,} train / {dataset.num_tokens('val'):,} "
        f"val tokens, vocab {dataset.vocab_size} ({tokenizer_path})"
    )
    return TrainData(dataset, tokenizer, tokenizer_path, shard_dir, note)


def build_loader(
    config: TrainConfig, data: TrainData, split: str, batch: BatchGeometry, rank: int
) -> TokenLoader:
    """This rank's loader of `split`: batch.per_rank windows per step, its share of each global
    batch (train.seed orders the windows the same on every world size)."""
    return TokenLoader(
        data.dataset,
        split,
        batch.per_rank,
        config.train.seq_len,
        seed=config.train.seed,
        rank=rank,
        world_size=batch.world_size,
        mode=config.data.mode,
    )
