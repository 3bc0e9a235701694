"""read_records: JSONL and Parquet rows as dicts with their location; bad rows name file:line."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ats_data.errors import DataError
from ats_data.records import read_records


def test_jsonl_and_parquet_rows_round_trip(tmp_path) -> None:
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": "2"}\n')
    records = list(read_records(jsonl))
    assert [r.row for r in records] == rows
    assert [r.where for r in records] == [f"{jsonl}:1", f"{jsonl}:3"]
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    assert [r.row for r in read_records(parquet)] == rows
    assert list(read_records(parquet))[1].where == f"{parquet}:row 1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1}\n{"a": \n', r"rows.jsonl: not valid JSON at line 2"),
        ('{"a": 1}\n[1, 2]\n', r"rows.jsonl:2: expected a JSON object, got list"),
    ],
)
def test_a_malformed_row_names_its_line(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        list(read_records(path))


def test_other_files_are_refused(tmp_path) -> None:
    with pytest.raises(DataError, match="no such file"):
        list(read_records(tmp_path / "missing.jsonl"))
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="expected a .jsonl, .ndjson or .parquet"):
        list(read_records(tmp_path / "rows.csv"))
