"""Each source kind yields the right documents in a deterministic order; bad input names the
file (and line or column)."""

import json
import re
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from ats_data.errors import DataError
from ats_data.sources import SourceFile, open_source


def test_single_text_file_splits_into_paragraphs(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(
        "first para\nline two\n\n\n  \nsecond\n\n    indented third\n", encoding="utf-8"
    )
    assert list(open_source(str(path))) == [
        "first para\nline two",
        "second",
        "    indented third\n",
    ]


def test_folder_gives_one_document_per_file_sorted(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("zz\n\nstill z")
    (tmp_path / "a.md").write_text("aa")
    (tmp_path / "notes.bin").write_bytes(b"\x00\x01")  # unknown suffix: not part of a folder
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "h.txt").write_text("hidden")
    src = open_source(tmp_path)
    assert [f.path.name for f in src.files] == ["a.md", "z.txt"]
    assert list(src) == ["aa", "zz\n\nstill z"]


def test_glob_matches_sorted_files(tmp_path):
    for name, text in [("c.txt", "C"), ("a.txt", "A"), ("b.log", "B")]:
        (tmp_path / name).write_text(text)
    assert list(open_source(str(tmp_path / "*.txt"))) == ["A", "C"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.txt").write_text("D")
    assert list(open_source(str(tmp_path / "**" / "*.txt"))) == ["A", "C", "D"]


def test_jsonl_reads_the_configured_field(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"body": "one", "id": 1}, {"body": "two\nlines"}, {"body": "ü"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert list(open_source(path, text_field="body")) == ["one", "two\nlines", "ü"]


def test_jsonl_without_the_field_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n{"content": "no text"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: no field 'text' \(fields: content\)"):
        list(open_source(path))


def test_jsonl_bad_json_and_non_string_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataError, match=r"d\.jsonl: not valid JSON at line 2 column 10: Expecting"):
        list(open_source(path))
    # json's message ends in "starting at"; the position was cut off, leaving "... at"
    path.write_text('{"text": "ok"}\n\n{"text": "no closing quote}\n')
    with pytest.raises(DataError) as e:
        list(open_source(path))
    assert str(e.value).endswith("d.jsonl: not valid JSON at line 3 column 10: Unterminated string")
    path.write_text('{"text": 3}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:1: field 'text' is int, expected a string"):
        list(open_source(path))


def _texts(n: int) -> list[str]:
    return [f"document {i} " + "x" * (i % 7) for i in range(n)]


def test_parquet_text_column(tmp_path):
    path = tmp_path / "d.parquet"
    texts = _texts(2500)  # more than one read batch
    pq.write_table(pa.table({"n": list(range(2500)), "text": texts}), path, row_group_size=700)
    assert list(open_source(path)) == texts


def test_arrow_file_and_stream_are_memory_mapped(tmp_path):
    texts = _texts(1500)
    table = pa.table({"content": pa.array(texts, type=pa.large_string())})
    file_path = tmp_path / "d.feather"
    feather.write_feather(table, file_path, compression="uncompressed")
    assert list(open_source(file_path, text_field="content")) == texts
    stream_path = tmp_path / "d.arrow"
    with pa.OSFile(str(stream_path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=400):
            w.write_batch(batch)
    assert list(open_source(stream_path, text_field="content")) == texts


def test_parquet_missing_column_wrong_type_and_nulls(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["a"]}), path)
    with pytest.raises(DataError, match=r"d\.parquet: no column 'text' \(columns: body\)"):
        list(open_source(path))
    pq.write_table(pa.table({"text": [1, 2]}), path)
    with pytest.raises(DataError, match=r"column 'text' has type int64, expected a string"):
        list(open_source(path))
    pq.write_table(pa.table({"text": ["a", None]}), path)
    with pytest.raises(DataError, match=r"column 'text' is null at row 1"):
        list(open_source(path))


def test_stdlib_is_the_standard_library_in_sorted_order():
    root = Path(sysconfig.get_paths()["stdlib"])
    src = open_source("stdlib:json")
    expected = sorted((root / "json").rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
    assert [f.path for f in src.files] == expected
    assert list(src) == [p.read_text(encoding="utf-8") for p in expected]
    full = open_source("stdlib")
    rel = [f.path.relative_to(root).parts for f in full.files]
    assert len(rel) > 500
    assert ("json", "decoder.py") in rel
    assert not any({"site-packages", "test", "tests"} & set(parts) for parts in rel)
    assert [f.path for f in full.files] == [f.path for f in open_source("stdlib").files]


def test_stdlib_unknown_package():
    with pytest.raises(DataError, match="no standard-library package 'no_such_pkg'"):
        open_source("stdlib:no_such_pkg")


def test_python_source_decoded_by_its_coding_cookie(tmp_path):
    path = tmp_path / "m.py"
    path.write_bytes("# -*- coding: latin-1 -*-\ns = 'caf\xe9'\n".encode("latin-1"))
    (doc,) = SourceFile(path, "python").documents()
    assert doc.endswith("s = 'café'\n")


def test_missing_path_unknown_format_and_bad_utf8(tmp_path):
    with pytest.raises(DataError, match=r"source not found: .*nope\.txt"):
        open_source(tmp_path / "nope.txt")
    with pytest.raises(DataError, match=r"source glob .* matched no files"):
        open_source(str(tmp_path / "*.jsonl"))
    (tmp_path / "x.bin").write_bytes(b"abc")
    with pytest.raises(DataError, match=r"unknown source format '\.bin' for .*x\.bin"):
        open_source(tmp_path / "x.bin")
    with pytest.raises(DataError, match="holds no files of a known format"):
        open_source(tmp_path)
    (tmp_path / "bad.txt").write_bytes(b"ok\xff")
    with pytest.raises(DataError, match=r"bad\.txt is not valid UTF-8: byte 0xff at offset 2"):
        list(open_source(tmp_path / "bad.txt"))


def test_fingerprint_tracks_file_changes(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one")
    before = open_source(path).fingerprint()
    assert open_source(path).fingerprint() == before
    path.write_text("one two")
    assert open_source(path).fingerprint() != before


def test_unreadable_parquet_arrow_and_jsonl_bytes(tmp_path):
    for name, message in [
        ("d.parquet", "not a readable Parquet file"),
        ("d.arrow", "not a readable Arrow"),
    ]:
        (tmp_path / name).write_bytes(b"this is not columnar data at all")
        with pytest.raises(DataError, match=re.escape(f"{name}: {message}")):
            list(open_source(tmp_path / name))
    (tmp_path / "d.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: not UTF-8 text \(byte 0xff at column 11\)"):
        list(open_source(tmp_path / "d.jsonl"))


def test_deeply_nested_jsonl_record_is_one_line(tmp_path):
    """A RecursionError traceback before."""
    path = tmp_path / "d.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text('{"text": "ok"}\n{"text": "x", "meta": ' + deep + "}\n")
    with pytest.raises(DataError, match=r"d\.jsonl: not valid JSON for this reader: .* nested"):
        list(open_source(path))


def test_paths_that_are_neither_file_nor_folder(tmp_path):
    """A device or a broken symlink was "source not found"; now the error says what is there."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    with pytest.raises(DataError, match="source '.*loop1' cannot be opened: Too many levels"):
        open_source(tmp_path / "loop1")
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    with pytest.raises(DataError, match="dangling.txt' does not exist \\(a symlink to nothing"):
        open_source(tmp_path / "dangling.txt")
    if Path("/dev/zero").exists():
        with pytest.raises(DataError, match="source '/dev/zero' is not a regular file"):
            open_source("/dev/zero")


def test_single_python_file_is_one_document(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\n\n\ndef f():\n    pass\n")
    assert list(open_source(path)) == ["import os\n\n\ndef f():\n    pass\n"]
