"""ats-data: text sources -> clean -> dedup -> train/val split -> memory-mapped token shards, and
resumable, rank-aware loaders over them. `TokenLoader` needs torch (extra `ats-data[torch]`); it
is imported on first use so that everything else works without torch."""

from ats_data.dataset import ShardDataset
from ats_data.errors import DataError
from ats_data.prepare import PrepareConfig, cache_key, prepare
from ats_data.sources import Source, SourceFile, open_source

__all__ = [
    "DataError",
    "PrepareConfig",
    "ShardDataset",
    "Source",
    "SourceFile",
    "TokenLoader",
    "cache_key",
    "open_source",
    "prepare",
]


def __getattr__(name: str):
    # PEP 562: `from ats_data import TokenLoader` imports torch only when asked for.
    if name == "TokenLoader":
        from ats_data.loader import TokenLoader

        return TokenLoader
    raise AttributeError(f"module 'ats_data' has no attribute {name!r}")
