"""Wikipedia `pages-articles*.xml[.bz2]` dumps (and the multistream variant with its index):
articles (namespace 0) only, redirects dropped, wikitext made plain text with mwparserfromhell the
way WikiExtractor users expect: templates, references, tables, galleries, math, comments, files
and categories removed; link labels, bold/italic text and section titles kept.

The XML is parsed as a stream (elements are cleared once read), so memory stays flat whatever
the dump size. A multistream dump is a sequence of independent bz2 streams of about 100 pages
each; `read_stream(dump, offset)` reads one of them, which lets several tasks share one dump
(the offsets come from the `...-multistream-index.txt.bz2` file beside it).
"""

import bz2
import io
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import mwparserfromhell
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)

from ats_data.corpora.dumpfile import DECODE_ERRORS, decode_error, iter_xml, local_name, open_dump
from ats_data.document import Document
from ats_data.errors import DataError

LICENCE = "CC-BY-SA-4.0"
# Link namespaces whose target is not running text (and their common English aliases).
_DROP_LINK_PREFIXES = frozenset(
    {
        "file",
        "image",
        "media",
        "category",
        "wikipedia",
        "wp",
        "template",
        "help",
        "portal",
        "special",
        "talk",
        "user",
        "module",
        "draft",
        "s",
        "wikt",
        "commons",
    }
)
_DROP_TAGS = frozenset(
    {
        "ref",
        "references",
        "gallery",
        "table",
        "math",
        "chem",
        "ce",
        "timeline",
        "score",
        "graph",
        "imagemap",
        "templatedata",
        "templatestyles",
        "mapframe",
        "maplink",
        "hiero",
        "inputbox",
        "categorytree",
        "style",
        "noinclude",
        "includeonly",
        "indicator",
    }
)
_LIST_MARKERS = frozenset({"li", "dt", "dd"})
_LINE_BREAK_TAGS = frozenset({"br", "p", "div", "hr"})
_LANG_PREFIX = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)?$")
_BLANK_LINES = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")
_SPACES = re.compile(r"[ \t\xa0]+")
# Table markup outside a parsed table (a table that does not start a line) and leftover
# template braces are not prose.
_TABLE_LINE = re.compile(r"^\s*(?:\{\||\|\}|\|-|!|\|).*$", re.MULTILINE)


def wikitext_to_text(wikitext: str) -> str:
    """Plain text of one article's wikitext."""
    parts: list[str] = []
    _render(mwparserfromhell.parse(wikitext, skip_style_tags=False).nodes, parts)
    text = "".join(parts)
    text = _TABLE_LINE.sub("", text)
    text = _SPACES.sub(" ", text)
    text = "\n".join(line.strip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", text).strip()


def _render(nodes, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, Text):
            out.append(str(node.value))
        elif isinstance(node, (Template, Argument, Comment)):
            continue
        elif isinstance(node, HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, Heading):
            out.append("\n\n")
            _render(node.title.nodes, out)
            out.append("\n\n")
        elif isinstance(node, Wikilink):
            _render_link(node, out)
        elif isinstance(node, ExternalLink):
            if node.title is not None:
                _render(node.title.nodes, out)
        elif isinstance(node, Tag):
            _render_tag(node, out)


def _render_link(link: Wikilink, out: list[str]) -> None:
    target = str(link.title).strip()
    prefix, colon, _ = target.partition(":")
    prefix = prefix.strip().lower()
    if colon and (prefix in _DROP_LINK_PREFIXES or _LANG_PREFIX.match(prefix)):
        return
    if target.startswith(":"):  # [[:Category:X]] is a visible link to the page
        target = target[1:]
    if link.text is not None:
        _render(link.text.nodes, out)
    else:
        out.append(target.split("#")[0] if not target.startswith("#") else target[1:])


def _render_tag(tag: Tag, out: list[str]) -> None:
    name = str(tag.tag).strip().lower()
    if name in _DROP_TAGS:
        return
    if name in _LINE_BREAK_TAGS:
        out.append("\n")
    if tag.wiki_markup and name in _LIST_MARKERS:
        return  # "*", "#", ";", ":" at the start of a line: the item text follows as Text
    if name == "nowiki" or name in ("pre", "syntaxhighlight", "source", "code"):
        if tag.contents is not None:
            out.append(str(tag.contents))
        return
    if tag.contents is not None:
        _render(tag.contents.nodes, out)


def _page_document(page: dict, base_url: str) -> Document:
    return Document(
        text=wikitext_to_text(page["text"]),
        source="wikipedia",
        id=page["id"],
        title=page["title"],
        url=base_url + page["title"].replace(" ", "_") if base_url else "",
        licence=LICENCE,
    )


def _pages(path: Path, stream, counts: Counter) -> Iterator[tuple[dict, str]]:
    """(page fields, article base url) for each article page of an XML stream."""
    base_url = ""
    page: dict | None = None
    depth = 0  # inside <page>: 1 at its children, 2 inside <revision>
    root = None
    for event, elem in iter_xml(path, stream):
        name = local_name(elem.tag)
        if root is None:
            root = elem
        if event == "start":
            if name == "page":
                page, depth = {"redirect": False}, 0
            elif page is not None:
                depth += 1
            continue
        if page is None:
            if name == "base" and elem.text:
                base_url = elem.text.rpartition("/")[0] + "/"
            elif name == "siteinfo":
                root.clear()
            continue
        if name == "page":
            page_done, page = page, None
            root.clear()  # constant memory: drop the finished page from the tree
            if page_done.get("ns") != "0":
                counts["wikipedia_other_namespace"] += 1
            elif page_done["redirect"] or page_done.get("text", "").lstrip()[:9].upper() == (
                "#REDIRECT"
            ):
                counts["wikipedia_redirect"] += 1
            else:
                page_done.setdefault("text", "")
                yield page_done, base_url
            continue
        depth -= 1
        if depth == 0 and name in ("title", "ns", "id"):
            page[name] = elem.text or ""
        elif depth == 0 and name == "redirect":
            page["redirect"] = True
        elif depth == 1 and name == "text":
            page["text"] = elem.text or ""


def raw_pages(path: Path, counts: Counter) -> Iterator[tuple[dict, str]]:
    """Article pages of a whole dump file (plain XML or bz2, multistream or not)."""
    with open_dump(path) as f:
        yield from _pages(path, f, counts)


def read(path: Path, counts: Counter) -> Iterator[Document]:
    for page, base_url in raw_pages(path, counts):
        yield _page_document(page, base_url)


def page_to_document(item: tuple[dict, str]) -> Document:
    """One raw page (from raw_pages) converted: the part worth running in worker processes."""
    return _page_document(*item)


def multistream_offsets(index_path: Path) -> list[int]:
    """The distinct stream offsets of a multistream index (lines `offset:page_id:title`),
    ascending."""
    offsets: set[int] = set()
    with open_dump(index_path) as f:
        try:
            for lineno, raw in enumerate(f, start=1):
                head = raw.split(b":", 1)[0]
                if not head.strip():
                    continue
                if not head.isdigit():
                    raise DataError(
                        f"{index_path}:{lineno}: expected 'offset:page_id:title', got {raw[:60]!r}"
                    )
                offsets.add(int(head))
        except DECODE_ERRORS as e:
            raise decode_error(index_path, e) from None
    return sorted(offsets)


def multistream_index(dump_path: Path) -> Path | None:
    """The index Wikimedia publishes beside a multistream dump (`...-multistream.xml.bz2` ->
    `...-multistream-index.txt.bz2`), or None when the dump is not one or the index is absent."""
    if "multistream" not in dump_path.name or not dump_path.name.endswith(".xml.bz2"):
        return None
    index = dump_path.with_name(dump_path.name.replace(".xml.bz2", "-index.txt.bz2"))
    return index if index.is_file() else None


def site_base_url(dump_path: Path) -> str:
    """The article base url of a multistream dump, from the <siteinfo> of its first stream
    (read_stream needs it for every later stream)."""
    decomp = bz2.BZ2Decompressor()
    head = b""
    with dump_path.open("rb") as f:
        try:
            while not decomp.eof and b"</siteinfo>" not in head:
                block = f.read(1 << 16)
                if not block:
                    break
                head += decomp.decompress(block)
        except DECODE_ERRORS as e:
            raise decode_error(dump_path, e) from None
    m = re.search(rb"<base>([^<]*)</base>", head)
    return m.group(1).decode("utf-8").rpartition("/")[0] + "/" if m else ""


def read_stream(
    dump_path: Path, offset: int, counts: Counter, base_url: str = ""
) -> Iterator[Document]:
    """The articles of the one bz2 stream that starts at byte `offset` of a multistream dump."""
    decomp = bz2.BZ2Decompressor()
    chunks: list[bytes] = []
    with dump_path.open("rb") as f:
        f.seek(offset)
        try:
            while not decomp.eof:
                block = f.read(1 << 16)
                if not block:
                    raise EOFError(f"stream at offset {offset} has no end-of-stream marker")
                chunks.append(decomp.decompress(block))
        except DECODE_ERRORS as e:
            raise decode_error(dump_path, e) from None
    xml = b"".join(chunks)
    # The first stream opens <mediawiki> and holds <siteinfo>; the last closes </mediawiki>.
    # Wrapping each stream in a root of its own makes every one of them a whole document.
    xml = re.sub(rb"^\s*<mediawiki[^>]*>", b"", xml).replace(b"</mediawiki>", b"")
    stream = io.BytesIO(b"<stream>" + xml + b"</stream>")
    for page, found_base in _pages(dump_path, stream, counts):
        yield _page_document(page, found_base or base_url)
