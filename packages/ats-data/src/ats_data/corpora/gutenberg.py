"""Project Gutenberg plain-text books: the licence header and footer stripped. The start of the
text is the line after a START marker (`*** START OF THE PROJECT GUTENBERG EBOOK ...`, `*** START
OF THIS ...`, and the older `*END*THE SMALL PRINT! ...` of pre-2000s files), followed by an
optional "Produced by ..." credit paragraph; the end is the first END marker after it (`*** END OF
THE/THIS PROJECT GUTENBERG EBOOK`, `End of the Project Gutenberg EBook of ...`, `End of Project
Gutenberg's ...`). A file without a START marker is skipped and counted: it is not a Gutenberg
text, or one whose boundaries cannot be found safely.

Text is UTF-8 when it decodes as such, else the encoding the header declares ("Character set
encoding: ISO-8859-1"), else Latin-1.
"""

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from ats_data.corpora.dumpfile import DECODE_ERRORS, decode_error, open_dump
from ats_data.document import Document

LICENCE = "Public domain in the USA (Project Gutenberg License)"
_START = re.compile(
    r"^\s*(?:\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG"
    r"|\*END\*?\s*THE SMALL PRINT"
    r"|\*{3}\s*START OF THE COPYRIGHTED PROJECT GUTENBERG).*$",
    re.IGNORECASE | re.MULTILINE,
)
_END = re.compile(
    r"^\s*(?:\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG"
    r"|End of (?:the |this )?Project Gutenberg(?:'s|\s+E-?Book|\s+E-?text|\s+Etext)"
    r"|\*{3}\s*END OF THE COPYRIGHTED PROJECT GUTENBERG).*$",
    re.IGNORECASE | re.MULTILINE,
)
# A START marker line may wrap: "*** START OF THE PROJECT GUTENBERG EBOOK PRIDE AND\nPREJUDICE ***"
_MARKER_TAIL = re.compile(r"\A[^\n]*\*\*\*[ \t]*\n")
_PRODUCED_BY = re.compile(
    r"\A\s*(?:Produced by|E-text prepared by|This e-?text was (?:prepared|produced) by|"
    r"Transcribed from)[^\n]*(?:\n[^\n]+)*\n\s*\n",
    re.IGNORECASE,
)
_EBOOK_ID = re.compile(r"\[E-?Book #(\d+)\]|\bEBook #(\d+)|\bEtext #(\d+)", re.IGNORECASE)
_TITLE = re.compile(r"^Title:\s*(.+)$", re.MULTILINE)
_CHARSET = re.compile(r"Character set encoding:\s*([\w-]+)", re.IGNORECASE)
_FILE_ID = re.compile(r"^(?:pg)?(\d+)(?:-\d+)?$")


def decode_book(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    m = _CHARSET.search(data[:8192].decode("latin-1"))
    if m:
        try:
            return data.decode(m.group(1), errors="replace")
        except LookupError:
            pass  # an unknown encoding name in the header: Latin-1 maps every byte
    return data.decode("latin-1")


def strip_boundaries(text: str) -> str | None:
    """The body of a Gutenberg text; None when it has no START marker."""
    text = text.replace("\r\n", "\n")
    start = _START.search(text)
    if start is None:
        return None
    body = text[start.end() :].lstrip("\n")
    marker = start.group(0).rstrip()
    if marker.lstrip().startswith("***") and not marker.endswith("***"):
        wrapped = _MARKER_TAIL.match(body)  # the marker's title wrapped onto the next line
        if wrapped:
            body = body[wrapped.end() :]
    end = _END.search(body)
    if end is not None:
        body = body[: end.start()]
    body = _PRODUCED_BY.sub("", body, count=1)
    return body.strip()


def book_id(path: Path, header: str) -> str:
    m = _FILE_ID.match(path.name.split(".")[0])
    if m:
        return m.group(1)
    m = _EBOOK_ID.search(header)
    return next(g for g in m.groups() if g) if m else path.stem


def read(path: Path, counts: Counter) -> Iterator[Document]:
    with open_dump(path) as f:
        try:
            data = f.read()
        except DECODE_ERRORS as e:
            raise decode_error(path, e) from None
    text = decode_book(data)
    body = strip_boundaries(text)
    if body is None:
        counts["gutenberg_no_start_marker"] += 1
        return
    header = text[: text.find(body[:200]) if body else 4096][:8192]
    title = _TITLE.search(header)
    ebook = book_id(path, header)
    yield Document(
        text=body,
        source="gutenberg",
        id=ebook,
        title=title.group(1).strip() if title else "",
        url=f"https://www.gutenberg.org/ebooks/{ebook}" if ebook.isdigit() else "",
        licence=LICENCE,
    )
