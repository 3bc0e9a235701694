"""Reference BPE trainer: streaming pre-token counts (with the deterministic prune rule) and
`train_bpe`, an incremental pair-count trainer with a lazy max-heap (Sennrich et al. 2016, as in
HF `tokenizers` and minbpe). The native trainer must return exactly the same merges."""

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from ats_tokenizer.bpe import merge_pair
from ats_tokenizer.pretokenize import PreTokenizer


class WordCounter:
    """Counts pre-tokens (key: UTF-8 bytes) over a stream of texts; mirrors ats_native.WordCounter."""

    def __init__(self, pattern: str) -> None:
        self._pretokenizer = PreTokenizer(pattern)
        self._counts: Counter[bytes] = Counter()

    def add(self, texts: Iterable[str]) -> None:
        counts = self._counts
        for text in texts:
            for piece in self._pretokenizer.split(text):
                counts[piece.encode("utf-8")] += 1

    def prune(self, max_words: int) -> None:
        """If more than max_words words are held, drop every word with count <= t for
        t = 1, 2, 3, ... until at most max_words remain (deterministic, order-free)."""
        if max_words < 0:
            raise ValueError(f"max_words must be >= 0, got {max_words}")
        t = 0
        while len(self._counts) > max_words:
            t += 1
            self._counts = Counter({w: c for w, c in self._counts.items() if c > t})

    def counts(self) -> dict[bytes, int]:
        return dict(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def train(self, n_merges: int, min_frequency: int) -> list[tuple[int, int]]:
        return train_bpe(self._counts, n_merges, min_frequency)


def train_bpe(
    counts: Mapping[bytes, int], n_merges: int, min_frequency: int
) -> list[tuple[int, int]]:
    """Learn up to n_merges merges; byte b has id b and merge i creates id 256 + i.

    Each step takes the pair with the highest total count (word count times adjacent positions,
    overlapping ones included), ties to the smallest (left, right); it stops early when that count
    is below min_frequency or no pair is left.
    """
    if n_merges < 0:
        raise ValueError(f"n_merges must be >= 0, got {n_merges}")
    words: list[list[int]] = []
    freqs: list[int] = []
    for word, count in counts.items():
        if count > 0 and len(word) >= 2:
            words.append(list(word))
            freqs.append(count)

    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)  # pair -> words that held it
    for wi, ids in enumerate(words):
        for pair in zip(ids, ids[1:], strict=False):
            pair_counts[pair] += freqs[wi]
            where[pair].add(wi)
    # Max-heap by count, then smallest pair; stale entries are skipped when popped.
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges and heap:
        neg_count, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if count != -neg_count:
            continue
        if count < min_frequency:
            break
        new_id = 256 + len(merges)
        merges.append(pair)
        changed: set[tuple[int, int]] = set()
        for wi in where.pop(pair):
            ids = words[wi]
            new_ids = merge_pair(ids, pair, new_id)
            if len(new_ids) == len(ids):
                continue
            f = freqs[wi]
            for old in zip(ids, ids[1:], strict=False):
                pair_counts[old] -= f
                changed.add(old)
            for new in zip(new_ids, new_ids[1:], strict=False):
                pair_counts[new] += f
                where[new].add(wi)
                changed.add(new)
            words[wi] = new_ids
        for p in changed:
            c = pair_counts[p]
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                del pair_counts[p]
                where.pop(p, None)
    return merges
