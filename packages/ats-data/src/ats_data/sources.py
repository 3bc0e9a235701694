"""Text sources: local text files, folders and globs, JSONL (one text field), Parquet and Arrow
(pyarrow, memory-mapped), the embedded default corpus (the Python standard library's own .py
files), `pyenv` (the running environment's .py/.md/.rst files: pyenv.py), and the published corpus dumps of ats_data.corpora (`wikipedia:PATH`, `arxiv:PATH`,
`stackexchange:PATH`, `gutenberg:PATH`, `pubmed:PATH`). `open_source(spec)` resolves a spec
string to a `Source` whose documents come out in a deterministic order, together with a
fingerprint of its files for the prepare cache key."""

import glob
import hashlib
import json
import re
import sys
import sysconfig
import tokenize
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from ats_tokenizer.inputs import check_input_file, parse_json

from ats_data import corpora
from ats_data.document import Document
from ats_data.errors import DataError
from ats_data.pyenv import PYENV_SPEC, pyenv_files, pyenv_roots

TEXT_SUFFIXES = frozenset({".txt", ".text", ".md", ".rst"})
PYTHON_SUFFIXES = frozenset({".py"})
JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})
PARQUET_SUFFIXES = frozenset({".parquet"})
ARROW_SUFFIXES = frozenset({".arrow", ".feather", ".ipc"})
KNOWN_SUFFIXES = (
    TEXT_SUFFIXES | PYTHON_SUFFIXES | JSONL_SUFFIXES | PARQUET_SUFFIXES | ARROW_SUFFIXES
)

STDLIB_SPEC = "stdlib"
# Test packages are left out of the embedded corpus: they hold deliberately mis-encoded and
# malformed fixtures and would double its size without adding ordinary code.
_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n(?:[ \t\r\f\v]*\n)*")
_ARROW_FILE_MAGIC = b"ARROW1"
_ARROW_BATCH_ROWS = 1024


@dataclass(frozen=True)
class SourceFile:
    """One file and how to read documents out of it.

    kind: "text" (the whole file is one document), "paragraphs" (one document per blank-line
    separated paragraph), "python" (whole file, decoded per PEP 263), "jsonl", "parquet",
    "arrow", or a corpus of ats_data.corpora ("wikipedia", "pubmed", ...; `selection` holds its
    [A,B] selection).
    """

    path: Path
    kind: str
    text_field: str = "text"
    selection: tuple[str, ...] = ()
    # A file that does not decode (as UTF-8, or per its PEP 263 cookie) is left out and counted
    # instead of ending the read: the pyenv corpus holds packages' deliberately broken fixtures.
    skip_undecodable: bool = False

    def documents(self) -> Iterator[str]:
        """The plain texts of the documents (a corpus file: see Source.documents)."""
        if self.kind in corpora.CORPORA:
            for doc in corpora.read_corpus(self.kind, [self.path], Counter(), self.selection):
                yield doc.text
            return
        if self.kind == "text":
            yield _read_utf8(self.path)
        elif self.kind == "paragraphs":
            yield from _PARAGRAPH_BREAK.split(_read_utf8(self.path))
        elif self.kind == "python":
            yield _read_python(self.path)
        elif self.kind == "jsonl":
            yield from _read_jsonl(self.path, self.text_field)
        elif self.kind == "parquet":
            yield from _read_parquet(self.path, self.text_field)
        elif self.kind == "arrow":
            yield from _read_arrow(self.path, self.text_field)
        else:
            raise DataError(f"unknown source kind {self.kind!r} for {self.path}")


@dataclass(frozen=True)
class Source:
    """An ordered list of files; iterating yields every document of every file in order."""

    spec: str
    files: tuple[SourceFile, ...]

    def __iter__(self) -> Iterator[str]:
        for doc in self.documents(Counter()):
            yield doc.text

    def documents(self, counts: Counter, workers: int = 1) -> Iterator[Document]:
        """Every document with its metadata, in order; what corpus readers leave out is added to
        `counts`. Consecutive files of one corpus are read together (PubMed's updates apply
        across files); workers > 1 lets a corpus reader convert in that many processes."""
        i = 0
        while i < len(self.files):
            f = self.files[i]
            if f.kind in corpora.CORPORA:
                j = i
                while j < len(self.files) and self.files[j].kind == f.kind:
                    j += 1
                paths = [g.path for g in self.files[i:j]]
                yield from corpora.read_corpus(f.kind, paths, counts, f.selection, workers)
                i = j
                continue
            if f.skip_undecodable:
                try:
                    texts = list(f.documents())  # one document: a "python" or "text" file
                except DataError:
                    counts["undecodable file"] += 1
                    texts = []
            else:
                texts = f.documents()
            for text in texts:
                yield Document(text=text, source=f.kind)
            i += 1

    def fingerprint(self) -> str:
        """sha256 over each file's kind, absolute path, size and mtime (a make-style check:
        editing a file changes the key without hashing every byte of a large corpus)."""
        h = hashlib.sha256()
        h.update(f"python {sys.version_info[:3]}\n".encode())
        for f in self.files:
            st = f.path.stat()
            line = [
                f.kind,
                f.text_field,
                list(f.selection),
                str(f.path.resolve()),
                st.st_size,
                st.st_mtime_ns,
            ]
            if f.skip_undecodable:
                line.append("skip_undecodable")
            h.update((json.dumps(line) + "\n").encode())
        return h.hexdigest()

    def num_bytes(self) -> int:
        return sum(f.path.stat().st_size for f in self.files)

    def describe(self) -> str:
        """What the source holds, e.g. "pyenv: 17536 files, 261.3 MB"."""
        return f"{self.spec}: {len(self.files)} files, {self.num_bytes() / 1e6:.1f} MB"


def open_source(spec: str | Path, *, text_field: str = "text") -> Source:
    """Resolve a source spec.

    - "stdlib" or "stdlib:PACKAGE" (e.g. "stdlib:json"): the standard library's .py files
      (test packages and site-packages left out), sorted by relative path.
    - "pyenv": every .py/.md/.rst file of the running environment's standard library and
      site-packages (pyenv.py), one document each; files that do not decode are skipped and
      counted.
    - a glob ("data/**/*.jsonl"): every matching file, sorted; each must have a known suffix.
    - a folder: every file with a known suffix below it (hidden entries skipped), sorted;
      each text file is one document.
    - a file: .txt/.text/.md/.rst (split into paragraphs at blank lines, so that a single file
      still gives a train/val split), .py (one document, decoded per its PEP 263 cookie),
      .jsonl/.ndjson, .parquet, .arrow/.feather/.ipc; a file of another type whose content is a
      corpus dump (a MediaWiki, PubMed or Posts.xml export, the arXiv metadata snapshot) is
      read as that corpus.
    - "wikipedia:PATH", "arxiv[CATEGORIES]:PATH", "stackexchange[SITES]:PATH",
      "gutenberg:PATH", "pubmed:PATH": PATH (file, folder or glob) read by that corpus reader.
    """
    spec = str(spec)
    parsed = corpora.parse_spec(spec)
    if parsed is not None:
        corpus, selection, path_spec = parsed
        found = corpora.corpus_files(corpus, path_spec, selection)
        return Source(spec, tuple(SourceFile(p, corpus.name, "text", selection) for p in found))
    if spec == PYENV_SPEC:
        found = pyenv_files(*pyenv_roots())
        if not found:
            raise DataError(
                "pyenv: no .py, .md or .rst files in the standard library or site-packages"
            )
        files = (SourceFile(p, kind, skip_undecodable=True) for p, kind in found)
        return Source(spec, tuple(files))
    if spec == STDLIB_SPEC or spec.startswith(STDLIB_SPEC + ":"):
        return Source(spec, tuple(_stdlib_files(spec[len(STDLIB_SPEC) + 1 :])))
    if any(ch in spec for ch in "*?["):
        matches = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
        if not matches:
            raise DataError(f"source glob {spec!r} matched no files")
        files = [SourceFile(p, _kind_for(p, single=False), text_field) for p in matches]
        return Source(spec, tuple(files))
    path = Path(spec)
    if path.is_dir():
        found = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in KNOWN_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not found:
            known = ", ".join(sorted(KNOWN_SUFFIXES))
            raise DataError(f"source folder {path} holds no files of a known format ({known})")
        return Source(
            spec, tuple(SourceFile(p, _kind_for(p, single=False), text_field) for p in found)
        )
    if path.is_file():
        return Source(spec, (SourceFile(path, _kind_for(path, single=True), text_field),))
    if path.exists() or path.is_symlink():
        try:
            check_input_file(path, "source")  # a device, a symlink loop or to nothing
        except OSError as e:
            raise DataError(str(e)) from None
    raise DataError(f"source not found: {spec} (no such file, folder or glob match)")


def _kind_for(path: Path, *, single: bool) -> str:
    suffix = path.suffix.lower()
    if suffix not in KNOWN_SUFFIXES:
        corpus = corpora.detect(path)
        if corpus is not None:
            return corpus
    if suffix in TEXT_SUFFIXES:
        return "paragraphs" if single else "text"
    if suffix in PYTHON_SUFFIXES:
        return "python"
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in ARROW_SUFFIXES:
        return "arrow"
    known = ", ".join(sorted(KNOWN_SUFFIXES))
    prefixes = ", ".join(f"{name}:PATH" for name in corpora.CORPORA)
    raise DataError(
        f"unknown source format {suffix or '(no suffix)'!r} for {path} (known: {known}; "
        f"or name the corpus: {prefixes})"
    )


def _stdlib_files(package: str) -> list[SourceFile]:
    root = Path(sysconfig.get_paths()["stdlib"])
    top = root / package if package else root
    if not top.is_dir() or (package and package in _STDLIB_SKIP_DIRS):
        raise DataError(f"no standard-library package {package!r} under {root}")
    found = [
        p
        for p in top.rglob("*.py")
        if p.is_file() and not _STDLIB_SKIP_DIRS.intersection(p.relative_to(root).parts)
    ]
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    if not found:
        raise DataError(f"no .py files under {top}")
    return [SourceFile(p, "python") for p in found]


def _read_utf8(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start}"
        ) from None


def _read_python(path: Path) -> str:
    # Python sources declare their own encoding (PEP 263); tokenize reads the cookie.
    with path.open("rb") as f:
        try:
            encoding, _ = tokenize.detect_encoding(f.readline)
        except SyntaxError as e:
            raise DataError(f"{path}: bad source encoding declaration: {e}") from None
    data = path.read_bytes()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise DataError(f"{path} does not decode as its declared {encoding}: {e.reason}") from None


def _read_jsonl(path: Path, text_field: str) -> Iterator[str]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                    f"{e.start + 1})"
                ) from None
            if not line.strip():
                continue
            # without its line end, an error at the end of the record stays on its own line
            record = parse_json(line.rstrip("\r\n"), str(path), DataError, line=lineno)
            if not isinstance(record, dict):
                raise DataError(
                    f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}"
                )
            if text_field not in record:
                fields = ", ".join(sorted(record)) or "none"
                raise DataError(f"{path}:{lineno}: no field {text_field!r} (fields: {fields})")
            text = record[text_field]
            if not isinstance(text, str):
                raise DataError(
                    f"{path}:{lineno}: field {text_field!r} is {type(text).__name__}, "
                    "expected a string"
                )
            yield text


def _check_text_column(path: Path, schema: pa.Schema, text_field: str) -> None:
    if text_field not in schema.names:
        raise DataError(f"{path}: no column {text_field!r} (columns: {', '.join(schema.names)})")
    col_type = schema.field(text_field).type
    if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
        raise DataError(f"{path}: column {text_field!r} has type {col_type}, expected a string")


def _column_texts(path: Path, column: pa.Array, text_field: str, row0: int) -> Iterator[str]:
    if column.null_count:
        row = row0 + column.is_null().to_pylist().index(True)
        raise DataError(f"{path}: column {text_field!r} is null at row {row}")
    yield from column.to_pylist()


def _read_parquet(path: Path, text_field: str) -> Iterator[str]:
    try:
        pf = pq.ParquetFile(path, memory_map=True)
    except pa.ArrowException as e:
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    _check_text_column(path, pf.schema_arrow, text_field)
    row = 0
    for batch in pf.iter_batches(batch_size=_ARROW_BATCH_ROWS, columns=[text_field]):
        yield from _column_texts(path, batch.column(0), text_field, row)
        row += batch.num_rows


def _read_arrow(path: Path, text_field: str) -> Iterator[str]:
    # The IPC file format starts with the magic "ARROW1"; anything else is read as the stream
    # format (what HF datasets writes). Both are memory-mapped: batches are zero-copy views.
    with pa.memory_map(str(path), "r") as mm:
        is_file_format = mm.read(len(_ARROW_FILE_MAGIC)) == _ARROW_FILE_MAGIC
        mm.seek(0)
        try:
            reader = pa.ipc.open_file(mm) if is_file_format else pa.ipc.open_stream(mm)
        except pa.ArrowException as e:
            raise DataError(f"{path}: not a readable Arrow IPC file or stream: {e}") from None
        _check_text_column(path, reader.schema, text_field)
        batches = (
            (reader.get_batch(i) for i in range(reader.num_record_batches))
            if is_file_format
            else reader
        )
        row = 0
        for batch in batches:
            column = batch.column(batch.schema.get_field_index(text_field))
            yield from _column_texts(path, column, text_field, row)
            row += batch.num_rows
