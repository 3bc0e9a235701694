"""Export to a tiktoken.Encoding. tiktoken ranks ARE token ids and a merge is found by the bytes of
the merged token, so the ids must be in merge order: byte b -> id b, merge i -> id 256 + i."""

import importlib
import importlib.util
from typing import Any


def to_tiktoken(
    name: str,
    pattern: str,
    byte_ids: tuple[int, ...],
    merges: tuple[tuple[int, int, int], ...],
    token_bytes: dict[int, bytes],
    special_tokens: dict[str, int],
) -> Any:
    if importlib.util.find_spec("tiktoken") is None:
        raise ImportError("to_tiktoken() needs the tiktoken package: pip install tiktoken")
    tiktoken = importlib.import_module("tiktoken")
    if list(byte_ids) != list(range(256)):
        raise ValueError(
            "cannot export to tiktoken: ids are not in merge order (byte b must have id b, "
            f"but byte 0x{next(b for b in range(256) if byte_ids[b] != b):02X} has another id)"
        )
    for rank, (_, _, merged) in enumerate(merges):
        if merged != 256 + rank:
            raise ValueError(
                f"cannot export to tiktoken: ids are not in merge order (merge {rank} creates id "
                f"{merged}, expected {256 + rank})"
            )
    ranks: dict[bytes, int] = {}
    for tid in range(256 + len(merges)):
        data = token_bytes[tid]
        if data in ranks:
            raise ValueError(
                f"cannot export to tiktoken: ids {ranks[data]} and {tid} both spell {data!r}"
            )
        ranks[data] = tid
    return tiktoken.Encoding(
        name=name,
        pat_str=pattern,
        mergeable_ranks=ranks,
        special_tokens=dict(special_tokens),
        explicit_n_vocab=len(ranks) + len(special_tokens),
    )
