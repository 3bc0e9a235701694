"""Encoding backends for ordinary text: the pure-Python reference and the ats_native fast path,
and the one place that chooses between them ("auto" | "python" | "native")."""

import importlib
import importlib.util
import logging
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Literal, Protocol

from ats_tokenizer.bpe import BpeTable, bpe_encode
from ats_tokenizer.pretokenize import NAMED_PATTERNS, PreTokenizer, check_text

Backend = Literal["auto", "python", "native"]
log = logging.getLogger("ats_tokenizer")
_logged: set[str] = set()


class Encoder(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str], threads: int) -> list[list[int]]: ...


def native_available() -> bool:
    return importlib.util.find_spec("ats_native") is not None


def choose_backend(backend: Backend, pattern: str) -> Literal["python", "native"]:
    """Resolve "auto"; a "native" request that cannot be served raises."""
    if backend not in ("auto", "python", "native"):
        raise ValueError(f"backend must be 'auto', 'python' or 'native', got {backend!r}")
    if backend == "python":
        return "python"
    if backend == "native":
        if not native_available():
            raise ValueError(
                "backend='native' requested but the ats_native module is not installed"
            )
        if pattern not in NAMED_PATTERNS:
            raise ValueError(
                "backend='native' supports only the GPT4_PATTERN and GPT2_PATTERN "
                f"pre-tokenization patterns, got {pattern!r}"
            )
        return "native"
    chosen = "native" if native_available() and pattern in NAMED_PATTERNS else "python"
    reason = f"{chosen} (ats_native installed: {native_available()}, named pattern: "
    reason += f"{pattern in NAMED_PATTERNS})"
    if reason not in _logged:
        _logged.add(reason)
        log.info("ats_tokenizer backend: %s", reason)
    return chosen


class PythonEncoder:
    """Reference encoder: regex split, then bpe_encode per pre-token (cached)."""

    name = "python"
    _CACHE_LIMIT = 1 << 16

    def __init__(self, table: BpeTable, pattern: str) -> None:
        self.table = table
        self.pattern = pattern
        self._pretokenizer = PreTokenizer(pattern)
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        for piece in self._pretokenizer.split(text):
            ids = cache.get(piece)
            if ids is None:
                ids = bpe_encode(piece.encode("utf-8"), self.table)
                if len(cache) >= self._CACHE_LIMIT:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)
        return out

    def encode_batch(self, texts: Sequence[str], threads: int) -> list[list[int]]:
        for text in texts:
            check_text(text)
        if threads <= 1 or len(texts) < 2:
            return [self.encode(t) for t in texts]
        # A process pool gets the table once per worker. fork where the OS has it: unlike spawn it
        # works from scripts without a __main__ guard, and workers only run pure-Python code.
        chunk = max(1, len(texts) // (threads * 4))
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        ctx = multiprocessing.get_context(method)
        with ProcessPoolExecutor(
            threads,
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(self.table.byte_ids, self.table.merges, self.pattern),
        ) as pool:
            return list(pool.map(_worker_encode, texts, chunksize=chunk))


_worker: PythonEncoder | None = None


def _init_worker(
    byte_ids: tuple[int, ...], merges: tuple[tuple[int, int, int], ...], pattern: str
) -> None:
    global _worker
    _worker = PythonEncoder(BpeTable(byte_ids, merges), pattern)


def _worker_encode(text: str) -> list[int]:
    assert _worker is not None, "worker used before _init_worker"
    return _worker.encode(text)


class NativeEncoder:
    """ats_native.BpeEncoder (C++, releases the GIL, threads in encode_batch)."""

    name = "native"

    def __init__(self, table: BpeTable, pattern: str) -> None:
        ats_native = importlib.import_module("ats_native")
        self._impl = ats_native.BpeEncoder(
            list(table.byte_ids), [tuple(m) for m in table.merges], NAMED_PATTERNS[pattern]
        )

    def encode(self, text: str) -> list[int]:
        return self._impl.encode(text)

    def encode_batch(self, texts: Sequence[str], threads: int) -> list[list[int]]:
        return self._impl.encode_batch(list(texts), threads)


def build_encoder(table: BpeTable, pattern: str, backend: Backend) -> Encoder:
    if choose_backend(backend, pattern) == "native":
        return NativeEncoder(table, pattern)
    return PythonEncoder(table, pattern)


# the most workers encode_batch starts: 4 per CPU, as ats_native bounds its threads (more only
# exhausts the host's process limit)
THREADS_PER_CPU = 4


def default_threads(num_threads: int | None) -> int:
    cpus = os.cpu_count() or 1
    if num_threads is None:
        return cpus
    if not 1 <= num_threads <= THREADS_PER_CPU * cpus:
        raise ValueError(
            f"num_threads = {num_threads}: expected 1 to {THREADS_PER_CPU * cpus} "
            f"({THREADS_PER_CPU} per CPU)"
        )
    return num_threads
