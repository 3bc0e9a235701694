"""Reference BPE encoding of one pre-token, and the validated (byte_ids, merges) table it runs on.

Semantics (briefs/tokenizer_api.md, = HF `tokenizers` BPE): start from the byte ids, repeatedly merge
the adjacent pair with the lowest rank, the leftmost occurrence first, until no pair has a rank.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BpeTable:
    """byte_ids[b] = id of the byte b; merges[rank] = (left_id, right_id, merged_id)."""

    byte_ids: tuple[int, ...]
    merges: tuple[tuple[int, int, int], ...]
    ranks: dict[tuple[int, int], tuple[int, int]] = field(init=False, repr=False, compare=False)
    token_bytes: dict[int, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.byte_ids) != 256:
            raise ValueError(f"byte_ids must hold 256 ids, got {len(self.byte_ids)}")
        token_bytes: dict[int, bytes] = {}
        for b, tid in enumerate(self.byte_ids):
            if tid in token_bytes:
                raise ValueError(
                    f"byte_ids: id {tid} is used for bytes {token_bytes[tid]!r} and {b}"
                )
            token_bytes[tid] = bytes([b])
        ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, (left, right, merged) in enumerate(self.merges):
            for side, tid in (("left", left), ("right", right)):
                if tid not in token_bytes:
                    raise ValueError(
                        f"merge {rank} ({left}, {right}) -> {merged}: {side} id {tid} is not a "
                        "byte id or the result of an earlier merge"
                    )
            if merged in token_bytes:
                raise ValueError(f"merge {rank}: merged id {merged} is already in use")
            if (left, right) in ranks:
                raise ValueError(f"merge {rank}: pair ({left}, {right}) appears twice")
            ranks[(left, right)] = (rank, merged)
            token_bytes[merged] = token_bytes[left] + token_bytes[right]
        object.__setattr__(self, "ranks", ranks)
        object.__setattr__(self, "token_bytes", token_bytes)


def bpe_encode(piece: bytes, table: BpeTable) -> list[int]:
    """Ids of one pre-token (its UTF-8 bytes) under `table`; O(n^2) but plain."""
    ids = [table.byte_ids[b] for b in piece]
    ranks = table.ranks
    while len(ids) >= 2:
        best: tuple[int, int, int] | None = None  # (rank, position, merged_id)
        for i in range(len(ids) - 1):
            hit = ranks.get((ids[i], ids[i + 1]))
            if hit is not None and (best is None or hit[0] < best[0]):
                best = (hit[0], i, hit[1])
        if best is None:
            break
        _, i, merged = best
        ids[i : i + 2] = [merged]
    return ids


def merge_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace occurrences of `pair` in `ids` by `new_id`, left to right, non-overlapping."""
    out: list[int] = []
    i, n = 0, len(ids)
    left, right = pair
    while i < n:
        if i + 1 < n and ids[i] == left and ids[i + 1] == right:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
