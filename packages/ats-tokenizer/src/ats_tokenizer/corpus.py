"""Streaming training input: files read in bounded chunks, texts split at special tokens and
grouped into batches, so the word counter never holds more than one batch of text.

A file chunk is cut only just after a "\\n" that sits between two non-whitespace characters. No
match of GPT4_PATTERN or GPT2_PATTERN spans such a point, and the match ending there is the same
whether or not the text goes on, so chunked counting equals counting the whole file (tested).
For user patterns this is not guaranteed.
"""

import codecs
from collections.abc import Iterable, Iterator, Sequence
from os import PathLike

import regex

from ats_tokenizer.inputs import check_input_file

CHUNK_CHARS = 1 << 20  # target size of a file chunk
BATCH_CHARS = 1 << 22  # characters handed to the word counter between prunes
_LAST_CUT = regex.compile(r"(?r)\S\n(?=\S)")  # (?r): search from the end


def iter_file_chunks(
    paths: Sequence[str | PathLike[str]], chunk_chars: int = CHUNK_CHARS
) -> Iterator[str]:
    """Texts of the files, each file cut into chunks of about chunk_chars at safe points."""
    for path in paths:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        pending = ""
        offset = 0
        with check_input_file(path, "training input").open("rb") as f:
            while block := f.read(chunk_chars):
                pending += _decode(decoder, block, path, offset)
                offset += len(block)
                if len(pending) >= chunk_chars:
                    cut = _LAST_CUT.search(pending)
                    if cut is not None:
                        yield pending[: cut.end()]
                        pending = pending[cut.end() :]
            pending += _decode(decoder, b"", path, offset, final=True)
        if pending:
            yield pending


def _decode(decoder, block: bytes, path, offset: int, final: bool = False) -> str:
    try:
        return decoder.decode(block, final=final)
    except UnicodeDecodeError as err:
        raise ValueError(
            f"training input {str(path)!r} is not valid UTF-8 (near byte {offset + err.start})"
        ) from None


def iter_batches(
    texts: Iterable[str], special_tokens: Sequence[str], batch_chars: int = BATCH_CHARS
) -> Iterator[list[str]]:
    """Batches of texts with special-token strings cut out (they are never merged into words)."""
    splitter = (
        regex.compile("|".join(regex.escape(t) for t in sorted(special_tokens, key=len)[::-1]))
        if special_tokens
        else None
    )
    batch: list[str] = []
    size = 0
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"training text {i} is {type(text).__name__}, expected str")
        pieces = splitter.split(text) if splitter is not None else [text]
        for piece in pieces:
            if piece:
                batch.append(piece)
                size += len(piece)
        if size >= batch_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
