"""extract: cleaned documents with metadata as JSONL plus a report; dedup modes; bad input and
existing outputs leave nothing half-written and nothing overwritten."""

import json
from pathlib import Path

import pytest
from ats_data.cli import main
from ats_data.errors import DataError
from ats_data.extract import extract

FIXTURES = Path(__file__).parent / "fixtures"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_extract_wikipedia_records_and_report(multistream_dump, tmp_path):
    out = tmp_path / "wiki.jsonl"
    report = extract(f"wikipedia:{multistream_dump}", out, dedup="minhash")
    records = _lines(out)
    assert [(r["id"], r["title"], r["licence"], r["source"]) for r in records] == [
        ("1208", "Alan Turing", "CC-BY-SA-4.0", "wikipedia"),
        ("1211", "Ada Lovelace", "CC-BY-SA-4.0", "wikipedia"),
    ]
    assert records[1]["url"] == "https://en.wikipedia.org/wiki/Ada_Lovelace"
    assert report["documents_read"] == 2 and report["documents_written"] == 2
    assert report["skipped"] == {"wikipedia_other_namespace": 1, "wikipedia_redirect": 2}
    assert report["minhash"]["removed"] == 0
    assert report["licences"] == {"CC-BY-SA-4.0": 2}
    assert json.loads((tmp_path / "wiki.jsonl.report.json").read_text()) == report


def test_dedup_modes(tmp_path):
    src = tmp_path / "d.jsonl"
    base = " ".join(f"word{i}" for i in range(200))  # 196 distinct shingles
    # the third is a near-duplicate of the first: J = 196 / 200
    texts = [base, base, base + " and then it slept", "something else entirely " * 10]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    written = {}
    for mode in ("none", "exact", "minhash"):
        report = extract(src, tmp_path / f"{mode}.jsonl", dedup=mode)
        written[mode] = report["documents_written"]
    assert written == {"none": 4, "exact": 3, "minhash": 2}


def test_errors_leave_no_output(tmp_path, pubmed_gz, capsys):
    data = pubmed_gz[0].read_bytes()
    pubmed_gz[0].write_bytes(data[:-20])  # truncated gzip
    out = tmp_path / "o.jsonl"
    assert main(["extract", "--source", f"pubmed:{pubmed_gz[0]}", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ats-data: error: ") and "truncated compressed stream" in err
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in pubmed_gz]


def test_existing_output_and_input_as_output_are_refused(tmp_path):
    book = FIXTURES / "gutenberg" / "pg1342.txt"
    out = tmp_path / "g.jsonl"
    out.write_text("mine\n")
    with pytest.raises(DataError, match="exists; choose another name or pass --force"):
        extract(f"gutenberg:{book}", out)
    assert out.read_text() == "mine\n"
    extract(f"gutenberg:{book}", out, force=True)
    assert _lines(out)[0]["id"] == "1342"
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "x"}\n')
    with pytest.raises(DataError, match="is one of the source's input files"):
        extract(src, src, force=True)


def test_filters_from_the_command_line(tmp_path, capsys):
    src = tmp_path / "d.jsonl"
    texts = ["call +1 415 555 0132 now", "x\nx\nx\nx", "short", "a fine ordinary sentence"]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "o.jsonl"
    argv = ["extract", "--source", str(src), "--out", str(out), "--min-chars", "6"]
    assert main([*argv, "--repetition-filter", "--pii"]) == 0
    report = json.loads((tmp_path / "o.jsonl.report.json").read_text())
    assert report["dropped_short"] == 1
    assert report["dropped_repetition"] == {"duplicate_line_fraction": 1}
    assert report["pii_replaced"] == {"phone": 1}
    assert [r["text"] for r in _lines(out)] == [
        "call |||PHONE_NUMBER||| now",
        "a fine ordinary sentence",
    ]
