"""arXiv: the metadata snapshot (`arxiv-metadata-oai-snapshot.json`, one JSON object a line with
id, title, abstract, categories, license, ...) and LaTeX source archives (the bulk
`arXiv_src_*.tar` files of per-paper `.gz` members, or the per-paper `.gz` files themselves).

LaTeX is cleaned as RedPajama's arxiv_cleaner does: everything before the first sectioning
command and from the bibliography / appendix on is dropped, comment lines and inline comments
removed, and argument-free macros defined with \\newcommand or \\def expanded inline. A paper
whose .tex files have no sectioning command gives no document (counted).

Category filters (`arxiv[cs.CL,math.*]:PATH`) keep papers with at least one matching category.
"""

import gzip
import io
import re
import tarfile
from collections import Counter
from collections.abc import Iterator, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

from ats_tokenizer.inputs import parse_json

from ats_data.corpora.dumpfile import DECODE_ERRORS, compression, decode_error, open_dump
from ats_data.document import Document
from ats_data.errors import DataError

# arXiv's default licence when `license` is null: the non-exclusive distribution licence.
DEFAULT_LICENCE = "http://arxiv.org/licenses/nonexclusive-distrib/1.0/"
_WHITESPACE = re.compile(r"\s+")

# RedPajama arxiv_cleaner: the first sectioning command starts the text...
_SECTION = re.compile(
    r"^(.*?)("
    + "|".join(
        rf"\\\b{cmd}\b\*?(?:\[(.*?)\])?\{{(.*?)\}}"
        for cmd in (
            "chapter",
            "part",
            "section",
            "subsection",
            "subsubsection",
            "paragraph",
            "subparagraph",
        )
    )
    + r")",
    re.DOTALL,
)
# ...and the first of these ends it.
_END = re.compile(
    r"(\\appendix|\\begin\{references\}|\\begin\{REFERENCES\}|\\begin\{thebibliography\}"
    r"|\\bibliography\{.*\})",
    re.DOTALL,
)
_COMMENT_LINE = re.compile(r"(?m)^%.*\n?")
_INLINE_COMMENT = re.compile(r"(?m)(?<!\\)%.*$")
_NEWCOMMAND = re.compile(r"\\\bnewcommand\b\*?\{(\\[a-zA-Z0-9]+?)\}\{(.*?)\}$")
_DEF = re.compile(r"\\def\s*(\\[a-zA-Z0-9]+?)\s*\{(.*?)\}$")


def matches_categories(categories: Sequence[str], wanted: Sequence[str]) -> bool:
    return not wanted or any(fnmatchcase(c, w) for c in categories for w in wanted)


def read_metadata(
    path: Path, counts: Counter, categories: Sequence[str] = ()
) -> Iterator[Document]:
    """Title + abstract of each paper in the metadata snapshot (JSON lines, optionally gz/bz2)."""
    with open_dump(path) as f:
        lineno = 0
        while True:
            try:
                raw = f.readline()
            except DECODE_ERRORS as e:
                raise decode_error(path, e) from None
            if not raw:
                return
            lineno += 1
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x})"
                ) from None
            record = parse_json(line.rstrip("\r\n"), str(path), DataError, line=lineno)
            if not isinstance(record, dict) or "id" not in record or "abstract" not in record:
                raise DataError(
                    f"{path}:{lineno}: not an arXiv metadata record (expected an object with "
                    "'id', 'title', 'abstract', 'categories')"
                )
            cats = str(record.get("categories") or "").split()
            if not matches_categories(cats, categories):
                counts["arxiv_other_category"] += 1
                continue
            title = _WHITESPACE.sub(" ", str(record.get("title") or "")).strip()
            abstract = _WHITESPACE.sub(" ", str(record["abstract"] or "")).strip()
            paper_id = str(record["id"])
            yield Document(
                text=f"{title}\n\n{abstract}" if title else abstract,
                source="arxiv",
                id=paper_id,
                title=title,
                url=f"https://arxiv.org/abs/{paper_id}",
                licence=record.get("license") or DEFAULT_LICENCE,
                meta={"categories": cats},
            )


def _non_arg_macros(tex: str) -> dict[str, str]:
    macros = {}
    for line in tex.splitlines():
        for pattern in (_NEWCOMMAND, _DEF):
            m = pattern.search(line.strip())
            if m:
                macros[m.group(1)] = m.group(2)
    return macros


def clean_tex(tex: str, macros: dict[str, str]) -> str | None:
    """RedPajama's cleaning of one .tex file; None when it has no sectioning command."""
    if not _SECTION.search(tex):
        return None
    tex = _SECTION.sub(r"\2", tex, count=1)
    tex = _COMMENT_LINE.sub("", tex)
    tex = _INLINE_COMMENT.sub("", tex)
    m = _END.search(tex)
    if m:
        tex = tex[: m.start()]
    for name, value in macros.items():
        # a macro name is followed by a non-alphanumeric character (\foo but not \foobar)
        tex = re.sub(re.escape(name) + r"(?![a-zA-Z0-9])", lambda _, v=value: v, tex)
    return tex.strip()


def paper_text(tex_files: Sequence[str]) -> str | None:
    """The cleaned text of a paper from the contents of its .tex files."""
    macros: dict[str, str] = {}
    for tex in tex_files:
        macros.update(_non_arg_macros(tex))
    cleaned = [c for tex in tex_files if (c := clean_tex(tex, macros))]
    return "\n\n".join(cleaned) if cleaned else None


def _tex_files_of(data: bytes) -> list[str]:
    """A per-paper source: a gzipped tar of files, or one gzipped .tex file."""
    try:
        payload = gzip.decompress(data)
    except (EOFError, OSError) as e:
        raise DataError(f"corrupt gzip data: {e}") from None
    try:
        with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
            return [
                tar.extractfile(m).read().decode("utf-8", errors="replace")
                for m in tar.getmembers()
                if m.isfile() and m.name.lower().endswith(".tex")
            ]
    except tarfile.ReadError:
        return [payload.decode("utf-8", errors="replace")]


def _paper_document(paper_id: str, tex_files: list[str], counts: Counter) -> Document | None:
    text = paper_text(tex_files)
    if text is None:
        counts["arxiv_no_section"] += 1
        return None
    return Document(
        text=text,
        source="arxiv",
        id=paper_id,
        url=f"https://arxiv.org/abs/{paper_id}",
        licence="see arXiv metadata",
    )


def _paper_id(member_name: str) -> str:
    # "2301/2301.00001.gz" -> "2301.00001"; old style "0701/astro-ph0701001.gz" keeps its name
    return Path(member_name).name.removesuffix(".gz")


def read_sources(path: Path, counts: Counter) -> Iterator[Document]:
    """Papers of one bulk source tar (members `YYMM/ID.gz`) or one per-paper `.gz` file."""
    if compression(path) == "gzip":
        try:
            doc = _paper_document(_paper_id(path.name), _tex_files_of(path.read_bytes()), counts)
        except DataError as e:
            raise DataError(f"{path}: {e}") from None
        if doc is not None:
            yield doc
        return
    try:
        tar = tarfile.open(path, mode="r:")
    except tarfile.ReadError as e:
        raise DataError(f"{path}: not an arXiv source tar or gzipped paper: {e}") from None
    with tar:
        try:
            for member in tar:
                if not (member.isfile() and member.name.endswith(".gz")):
                    continue
                data = tar.extractfile(member).read()
                try:
                    doc = _paper_document(_paper_id(member.name), _tex_files_of(data), counts)
                except DataError:
                    counts["arxiv_corrupt_paper"] += 1  # one bad paper of a bulk tar: skipped
                    continue
                if doc is not None:
                    yield doc
        except (tarfile.TarError, EOFError, OSError) as e:
            raise DataError(f"{path}: truncated or corrupt tar: {e}") from None


def read(path: Path, counts: Counter, categories: Sequence[str] = ()) -> Iterator[Document]:
    """Metadata snapshot (.json / .jsonl, optionally compressed) or LaTeX sources (.tar, .gz)."""
    name = path.name.lower()
    if name.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz", ".json.bz2", ".jsonl.bz2")):
        yield from read_metadata(path, counts, categories)
    elif categories:
        raise DataError(
            f"{path}: arXiv category filters need the metadata snapshot (LaTeX sources carry "
            "no categories)"
        )
    else:
        yield from read_sources(path, counts)
