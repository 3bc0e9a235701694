"""Opening a dump file: the compression is read from its magic bytes (bz2, gzip, or none; a 7z
or zip archive is refused with the command that unpacks it), and decompression and XML errors
become one-line DataErrors naming the file (truncated stream, corrupt data, malformed XML with
line and column)."""

import bz2
import gzip
import io
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ats_tokenizer.inputs import check_input_file

from ats_data.errors import DataError

_MAGIC = {
    b"BZh": "bz2",
    b"\x1f\x8b": "gzip",
    b"7z\xbc\xaf\x27\x1c": "7z",
    b"PK\x03\x04": "zip",
}


def compression(path: Path) -> str:
    """'bz2', 'gzip', '7z', 'zip' or 'none', from the first bytes of the file."""
    try:
        check_input_file(path, "source")
    except OSError as e:
        raise DataError(str(e)) from None
    with path.open("rb") as f:
        head = f.read(8)
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    return "none"


def peek_text(path: Path, n: int = 4096) -> str:
    """The first n decompressed bytes as text (undecodable bytes replaced), for detection."""
    with open_dump(path) as f:
        try:
            head = f.read(n)
        except (EOFError, OSError, zlib.error):
            return ""
    return head.decode("utf-8", errors="replace")


@contextmanager
def open_dump(path: Path) -> Iterator[io.BufferedIOBase]:
    kind = compression(path)
    if kind in ("7z", "zip"):
        tool = "7z x" if kind == "7z" else "unzip"
        raise DataError(
            f"{path} is a {kind} archive; unpack it first ({tool} {path.name}) and point the "
            "source at the extracted file or folder"
        )
    if kind == "bz2":
        f = bz2.open(path, "rb")  # reads every stream of a multistream file in turn
    elif kind == "gzip":
        f = gzip.open(path, "rb")
    else:
        f = path.open("rb")
    with f:
        yield f


def decode_error(path: Path, err: BaseException) -> DataError:
    """A decompression or XML error as one line naming the file."""
    if isinstance(err, EOFError):
        return DataError(f"{path}: truncated compressed stream (the file ends mid-stream): {err}")
    if isinstance(err, ET.ParseError):
        line, col = err.position
        reason = str(err.msg).split(":")[0]  # expat appends its own "line L, column C"
        return DataError(f"{path}: malformed XML at line {line} column {col + 1}: {reason}")
    return DataError(f"{path}: corrupt compressed data: {err}")


DECODE_ERRORS = (EOFError, OSError, zlib.error, ET.ParseError)


def local_name(tag: str) -> str:
    """'page' for '{http://www.mediawiki.org/xml/export-0.11/}page'."""
    return tag.rpartition("}")[2]


def iter_xml(path: Path, stream: io.BufferedIOBase) -> Iterator[tuple[str, ET.Element]]:
    """(event, element) pairs of a streaming parse with start and end events; every error is a
    DataError naming the file. Callers clear the elements they are done with."""
    events = ET.iterparse(stream, events=("start", "end"))
    while True:
        try:
            event, elem = next(events)
        except StopIteration:
            return
        except DECODE_ERRORS as e:
            raise decode_error(path, e) from None
        yield event, elem


def element_text(elem: ET.Element | None) -> str:
    """All text inside an element, markup such as <i> and <sup> flattened."""
    return "" if elem is None else "".join(elem.itertext())
