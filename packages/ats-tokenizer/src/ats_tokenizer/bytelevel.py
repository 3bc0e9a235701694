"""The byte <-> unicode map of GPT-2 / HF ByteLevel: each byte gets a printable character so that
vocabulary entries and merges can be stored as JSON strings (Radford et al. 2019, encoder.py)."""


def _bytes_to_unicode() -> dict[int, str]:
    # Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100 upward in order.
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE: dict[int, str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_UNICODE.items()}


def bytes_to_unicode_str(data: bytes) -> str:
    """Bytes -> their ByteLevel string (one character per byte)."""
    return "".join(BYTE_TO_UNICODE[b] for b in data)


def unicode_str_to_bytes(token: str) -> bytes:
    """ByteLevel string -> bytes; a character outside the 256-character alphabet is a ValueError."""
    out = bytearray()
    for ch in token:
        b = UNICODE_TO_BYTE.get(ch)
        if b is None:
            raise ValueError(
                f"token {token!r} holds {ch!r} (U+{ord(ch):04X}), which is not in the "
                "ByteLevel alphabet: this is not a byte-level BPE vocabulary"
            )
        out.append(b)
    return bytes(out)
