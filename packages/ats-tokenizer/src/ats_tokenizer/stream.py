"""Streaming decode for generation: ids arrive one by one, text leaves only as complete UTF-8
characters, and the concatenation of everything emitted equals Tokenizer.decode(all ids)."""

import codecs
import numbers
from collections.abc import Callable, Iterable


class StreamDecoder:
    """Feed ids with `push`; call `finish` at the end of generation."""

    def __init__(self, decode_bytes: Callable[[Iterable[int]], bytes]) -> None:
        self._decode_bytes = decode_bytes
        # An incremental UTF-8 decoder holds back an incomplete trailing sequence; with
        # errors="replace" it replaces exactly what bytes.decode(errors="replace") would.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: int | Iterable[int]) -> str:  # one id (numpy ints too) or several
        """Text completed by these ids ("" while a character is still incomplete)."""
        data = self._decode_bytes([ids] if isinstance(ids, numbers.Integral) else ids)
        return self._utf8.decode(data, final=False)

    def finish(self) -> str:
        """Flush: an incomplete trailing sequence becomes U+FFFD, as in decode()."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
