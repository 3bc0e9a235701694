"""Readers for published corpus dumps, one module each: Wikipedia, arXiv, StackExchange, Project
Gutenberg, PubMed. A source spec `NAME:PATH` or `NAME[SELECTION]:PATH` picks one (PATH a file,
folder or glob; SELECTION arXiv categories or StackExchange sites, comma-separated); a single
file is also recognised by its content when that is unambiguous (`detect`).

Every reader streams documents (`ats_data.document.Document`) and counts what it leaves out
(redirects, retractions, unanswered questions, ...) into a Counter the caller reports."""

import glob
import multiprocessing
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ats_data.corpora import arxiv, gutenberg, pubmed, stackexchange, wikipedia
from ats_data.corpora.dumpfile import compression, peek_text
from ats_data.document import Document
from ats_data.errors import DataError

_SPEC = re.compile(r"^(?P<name>[a-z]+)(?:\[(?P<selection>[^\]]*)\])?:(?P<path>.+)$", re.DOTALL)


@dataclass(frozen=True)
class Corpus:
    name: str
    patterns: tuple[str, ...]  # the files of a folder this reader takes (glob, recursive)
    selection: str  # what [A,B] selects, "" when the reader takes no selection
    whole_set: bool = False  # read all files together (PubMed: later files update earlier)


CORPORA = {
    c.name: c
    for c in (
        Corpus("wikipedia", ("**/*pages-articles*.xml", "**/*pages-articles*.xml.bz2"), ""),
        Corpus(
            "arxiv",
            ("**/*.json", "**/*.jsonl", "**/*.json.gz", "**/*.jsonl.gz", "**/*.tar", "**/*.gz"),
            "categories",
        ),
        Corpus("stackexchange", ("**/Posts.xml",), "sites"),
        Corpus("gutenberg", ("**/*.txt", "**/*.txt.gz"), ""),
        Corpus("pubmed", ("**/*.xml.gz", "**/*.xml"), "", whole_set=True),
    )
}


def parse_spec(spec: str) -> tuple[Corpus, tuple[str, ...], str] | None:
    """(corpus, selection, path) for `NAME[SEL]:PATH` with a known NAME, else None."""
    m = _SPEC.match(spec)
    if m is None or m.group("name") not in CORPORA:
        return None
    corpus = CORPORA[m.group("name")]
    selection = tuple(s.strip() for s in (m.group("selection") or "").split(",") if s.strip())
    if m.group("selection") is not None and not corpus.selection:
        raise DataError(f"source {spec!r}: {corpus.name} takes no [selection]")
    if m.group("selection") is not None and not selection:
        raise DataError(f"source {spec!r}: empty [{corpus.selection}] selection")
    return corpus, selection, m.group("path")


def corpus_files(corpus: Corpus, path_spec: str, selection: Sequence[str]) -> list[Path]:
    """The files a corpus reads for PATH (a file, a folder or a glob), sorted."""
    if corpus.name == "stackexchange" and not any(ch in path_spec for ch in "*?["):
        return stackexchange.posts_files(Path(path_spec), selection)
    if any(ch in path_spec for ch in "*?["):
        found = sorted({Path(p) for p in glob.glob(path_spec, recursive=True) if Path(p).is_file()})
        if not found:
            raise DataError(f"{corpus.name} source glob {path_spec!r} matched no files")
        return found
    path = Path(path_spec)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(
            {p for pattern in corpus.patterns for p in path.glob(pattern) if p.is_file()}
            - {p for p in path.glob("**/*multistream-index*") if p.is_file()}
        )
        if not found:
            raise DataError(
                f"{corpus.name} source folder {path} holds no {', '.join(corpus.patterns)} files"
            )
        return found
    raise DataError(f"{corpus.name} source not found: {path_spec}")


def detect(path: Path) -> str | None:
    """The corpus a single file holds when its content says so unambiguously, else None."""
    if compression(path) in ("7z", "zip"):
        return None
    head = peek_text(path)
    if "<mediawiki" in head and "<siteinfo" in head or "<mediawiki " in head[:600]:
        return "wikipedia"
    if "<PubmedArticleSet" in head:
        return "pubmed"
    if re.search(r"<posts>\s*<row ", head):
        return "stackexchange"
    first = head.lstrip().split("\n", 1)[0]
    if first.startswith("{") and all(f'"{k}"' in first for k in ("id", "abstract", "categories")):
        return "arxiv"
    return None


def _reader(name: str, selection: Sequence[str]) -> Callable[[Path, Counter], Iterator[Document]]:
    if name == "arxiv":
        return lambda path, counts: arxiv.read(path, counts, selection)
    return {
        "wikipedia": wikipedia.read,
        "stackexchange": stackexchange.read,
        "gutenberg": gutenberg.read,
    }[name]


def read_corpus(
    name: str,
    paths: Sequence[Path],
    counts: Counter,
    selection: Sequence[str] = (),
    workers: int = 1,
) -> Iterator[Document]:
    """Documents of `paths` read by corpus `name`. workers > 1 converts Wikipedia's wikitext in
    that many processes (the XML parse stays in this one; output order is the input order)."""
    if name == "pubmed":
        yield from pubmed.read(paths, counts)
        return
    if name == "wikipedia" and workers > 1:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers) as pool:
            for path in paths:
                pages = wikipedia.raw_pages(path, counts)
                yield from pool.imap(wikipedia.page_to_document, pages, chunksize=16)
        return
    read = _reader(name, selection)
    for path in paths:
        yield from read(path, counts)
