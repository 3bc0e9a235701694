"""class Tokenizer: the public face of ats-tokenizer (train, encode/decode, files, interop).

Id layout of tokenizers ATS trains: 0..255 = bytes, 256 + i = merge i, special tokens last.
Loaded HF files may use any layout; ids must be dense (0..vocab_size-1) either way.
"""

import hashlib
import importlib
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from ats_tokenizer import chat, corpus, hf_json, inputs, tiktoken_export
from ats_tokenizer.backend import Backend, build_encoder, choose_backend, default_threads
from ats_tokenizer.bpe import BpeTable
from ats_tokenizer.hf_json import TokenizerFileError
from ats_tokenizer.pretokenize import GPT4_PATTERN, NAMED_PATTERNS, PreTokenizer, check_text
from ats_tokenizer.special import SpecialMatcher, SpecialSpec, resolve_special
from ats_tokenizer.stream import StreamDecoder
from ats_tokenizer.train import WordCounter

EOS_TOKEN = "<|endoftext|>"
DEFAULT_MAX_WORDS = 1_000_000  # unique pre-tokens kept while counting (bounded memory)


class Tokenizer:
    def __init__(
        self,
        byte_ids: Sequence[int],
        merges: Sequence[tuple[int, int, int]],
        special_tokens: Mapping[str, int],
        pattern: str = GPT4_PATTERN,
        *,
        backend: Backend = "auto",
    ) -> None:
        self._table = BpeTable(tuple(byte_ids), tuple(tuple(m) for m in merges))
        PreTokenizer(pattern)  # validates the pattern
        self.pattern = pattern
        self.special_tokens: dict[str, int] = dict(special_tokens)
        for content, tid in self.special_tokens.items():
            if not isinstance(content, str) or not content:
                raise ValueError(f"special token {content!r} must be a non-empty string")
            if tid in self._table.token_bytes:
                raise ValueError(f"special token {content!r} has id {tid}, already a BPE token")
        if len(set(self.special_tokens.values())) != len(self.special_tokens):
            raise ValueError(f"special tokens share ids: {self.special_tokens}")
        id_bytes = dict(self._table.token_bytes)
        id_bytes.update({tid: s.encode("utf-8") for s, tid in self.special_tokens.items()})
        self.vocab_size = len(id_bytes)
        missing = sorted(set(range(self.vocab_size)) - id_bytes.keys())
        if missing:
            raise ValueError(
                f"token ids must be 0..{self.vocab_size - 1} without gaps; missing {missing[:5]}"
            )
        self._id_bytes = [id_bytes[i] for i in range(self.vocab_size)]
        self._backend_request = backend
        self._encoder = build_encoder(self._table, pattern, backend)
        self._matchers: dict[tuple[frozenset[str], frozenset[str]], SpecialMatcher] = {}

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        *,
        min_frequency: int = 2,
        special_tokens: Sequence[str] = (EOS_TOKEN,),
        pattern: str = GPT4_PATTERN,
        max_words: int | None = DEFAULT_MAX_WORDS,
        backend: Backend = "auto",
    ) -> "Tokenizer":
        """Learn merges from texts; see train.train_bpe for the exact rule."""
        if isinstance(texts, str | bytes):
            raise TypeError("texts must be an iterable of str (e.g. a list), not one string")
        special_tokens = tuple(special_tokens)
        if len(set(special_tokens)) != len(special_tokens):
            raise ValueError(f"special_tokens has duplicates: {special_tokens}")
        n_merges = vocab_size - 256 - len(special_tokens)
        if n_merges < 0:
            raise ValueError(
                f"vocab_size={vocab_size} is too small: it must be at least 256 (bytes) + "
                f"{len(special_tokens)} (special tokens) = {256 + len(special_tokens)}"
            )
        if min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
        if choose_backend(backend, pattern) == "native":
            native = importlib.import_module("ats_native")
            counter = native.WordCounter(NAMED_PATTERNS[pattern])
        else:
            counter = WordCounter(pattern)
        for batch in corpus.iter_batches(texts, special_tokens):
            counter.add(batch)
            if max_words is not None:
                counter.prune(max_words)
        pairs = counter.train(n_merges, min_frequency)
        merges = [(left, right, 256 + i) for i, (left, right) in enumerate(pairs)]
        first_special = 256 + len(merges)
        specials = {s: first_special + j for j, s in enumerate(special_tokens)}
        return cls(range(256), merges, specials, pattern, backend=backend)

    def with_special_tokens(self, tokens: Sequence[str]) -> "Tokenizer":
        """This tokenizer plus those of `tokens` it lacks, as special tokens at the next free ids
        (every existing id keeps its meaning)."""
        specials = dict(self.special_tokens)
        for token in tokens:
            if token not in specials:
                specials[token] = self.vocab_size + len(specials) - len(self.special_tokens)
        return Tokenizer(
            self._table.byte_ids,
            self._table.merges,
            specials,
            self.pattern,
            backend=self._backend_request,
        )

    @classmethod
    def train_from_files(
        cls, paths: Sequence[str | PathLike[str]], vocab_size: int, **kwargs: Any
    ) -> "Tokenizer":
        """Tokenizer.train over UTF-8 files streamed in chunks (see corpus.iter_file_chunks)."""
        if isinstance(paths, str | PathLike):
            paths = [paths]
        return cls.train(corpus.iter_file_chunks(paths), vocab_size, **kwargs)

    @classmethod
    def load(cls, path: str | PathLike[str], *, backend: Backend = "auto") -> "Tokenizer":
        """Read a HF tokenizer.json (ours or HF's byte-level BPE)."""
        source = str(path)
        data = inputs.read_json_file(path, "tokenizer file", TokenizerFileError)
        loaded = hf_json.from_hf_dict(data, source)
        try:
            return cls(
                loaded.byte_ids,
                loaded.merges,
                loaded.special_tokens,
                loaded.pattern,
                backend=backend,
            )
        except TokenizerFileError:
            raise
        except ValueError as err:  # merges or special tokens that do not form a table
            raise TokenizerFileError(f"{source}: {err}") from err

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self._table.byte_ids, self._table.merges, self.special_tokens, self.pattern)
        return (_rebuild, (*args, self._backend_request))

    # ---- encoding -----------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._encoder.name

    def encode_ordinary(self, text: str) -> list[int]:
        """Everything is ordinary text, special-token strings included."""
        check_text(text)
        return self._encoder.encode(text)

    def _pieces(
        self, text: str, allowed_special: SpecialSpec, disallowed_special: SpecialSpec
    ) -> list[tuple[str, bool]]:
        check_text(text)
        key = resolve_special(self.special_tokens, allowed_special, disallowed_special)
        matcher = self._matchers.get(key)
        if matcher is None:
            matcher = self._matchers[key] = SpecialMatcher(*key)
        matcher.check(text)
        return list(matcher.split(text))

    def encode(
        self,
        text: str,
        allowed_special: SpecialSpec = frozenset(),
        disallowed_special: SpecialSpec = "all",
    ) -> list[int]:
        """tiktoken semantics: a disallowed special-token string raises ValueError; an allowed one
        becomes its id; with disallowed_special=() it is ordinary text."""
        ids: list[int] = []
        for piece, is_special in self._pieces(text, allowed_special, disallowed_special):
            ids.extend([self.special_tokens[piece]] if is_special else self._encoder.encode(piece))
        return ids

    def encode_batch(
        self,
        texts: Sequence[str],
        allowed_special: SpecialSpec = frozenset(),
        disallowed_special: SpecialSpec = "all",
        num_threads: int | None = None,
    ) -> list[list[int]]:
        """encode() over many texts on num_threads cores (default: all): native threads, or a
        process pool for the Python backend."""
        per_text = [self._pieces(t, allowed_special, disallowed_special) for t in texts]
        ordinary = [piece for pieces in per_text for piece, special in pieces if not special]
        encoded = iter(self._encoder.encode_batch(ordinary, default_threads(num_threads)))
        out: list[list[int]] = []
        for pieces in per_text:
            ids: list[int] = []
            for piece, is_special in pieces:
                ids.extend([self.special_tokens[piece]] if is_special else next(encoded))
            out.append(ids)
        return out

    # ---- decoding -----------------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        table = self._id_bytes
        n = len(table)
        out = []
        for tid in ids:
            i = operator.index(tid)
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is out of range [0, {n})")
            out.append(table[i])
        return b"".join(out)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids; bytes that are not valid UTF-8 become U+FFFD (as HF and tiktoken do)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self.decode_bytes)

    # ---- special tokens and chat --------------------------------------------------------------
    @property
    def eos_id(self) -> int:
        if EOS_TOKEN not in self.special_tokens:
            raise ValueError(
                f"this tokenizer has no {EOS_TOKEN!r} special token (it has "
                f"{sorted(self.special_tokens)})"
            )
        return self.special_tokens[EOS_TOKEN]

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False
    ) -> tuple[list[int], list[int]]:
        """(ids, loss_mask) in the ChatML format documented in ats_tokenizer.chat."""
        return chat.apply_chat_template(
            messages, self.special_tokens, self.encode_ordinary, add_generation_prompt
        )

    # ---- files and interop --------------------------------------------------------------------
    def to_json(self) -> str:
        """Canonical tokenizer.json text."""
        table = self._table
        obj = hf_json.to_hf_dict(
            table.token_bytes, list(table.merges), self.special_tokens, self.pattern
        )
        return hf_json.dumps(obj)

    def save(self, path: str | PathLike[str]) -> None:
        """Write tokenizer.json through a temp file in the same folder and a rename: a crash or a
        full disk leaves the old file (or none), never a half-written one."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(self.to_json(), encoding="utf-8")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def to_tiktoken(self, name: str = "ats") -> Any:
        t = self._table
        return tiktoken_export.to_tiktoken(
            name, self.pattern, t.byte_ids, t.merges, t.token_bytes, self.special_tokens
        )

    @property
    def byte_ids(self) -> tuple[int, ...]:
        return self._table.byte_ids

    @property
    def merges(self) -> tuple[tuple[int, int, int], ...]:
        return self._table.merges

    def __repr__(self) -> str:
        name = NAMED_PATTERNS.get(self.pattern, "custom")
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, pattern={name}, "
            f"specials={len(self.special_tokens)}, backend={self.backend})"
        )


def _rebuild(
    byte_ids: tuple[int, ...],
    merges: tuple[tuple[int, int, int], ...],
    special_tokens: dict[str, int],
    pattern: str,
    backend: Backend,
) -> Tokenizer:
    return Tokenizer(byte_ids, merges, special_tokens, pattern, backend=backend)
