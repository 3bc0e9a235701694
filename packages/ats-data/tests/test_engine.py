"""The datatrove path (ats_data.engine) against single-machine extract on the corpus fixtures:
the same records, in the same order, and the same report, with 2 tasks and 1 or 2 workers."""

import json
from pathlib import Path

import pytest

pytest.importorskip("datatrove")

from ats_data.cli import main  # noqa: E402
from ats_data.engine import extract_local, plan_units, task_share  # noqa: E402
from ats_data.extract import extract  # noqa: E402
from ats_data.sources import open_source  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _mixed_jsonl(folder: Path) -> Path:
    """Documents over three files with exact and near duplicates across files."""
    base = " ".join(f"word{i}" for i in range(200))
    files = {
        "a.jsonl": [base, "alpha " * 30, base],
        "b.jsonl": [base + " and then it slept", "beta gamma delta " * 12, "alpha " * 30],
        "c.jsonl": ["something else entirely " * 10, base + " and then it slept"],
    }
    for name, texts in files.items():
        (folder / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return folder


def _same(source: str, tmp_path: Path, dedup: str, workers: int) -> list[dict]:
    single = tmp_path / f"single-{dedup}.jsonl"
    engine = tmp_path / f"engine-{dedup}-{workers}.jsonl"
    expected = extract(source, single, dedup=dedup)
    got = extract_local(source, engine, tasks=2, workers=workers, dedup=dedup)
    assert got == expected
    assert engine.read_bytes() == single.read_bytes()
    return _lines(engine)


@pytest.mark.parametrize("dedup", ["none", "exact", "minhash"])
def test_jsonl_files_split_across_tasks(tmp_path, dedup):
    (tmp_path / "in").mkdir()
    src = _mixed_jsonl(tmp_path / "in")
    records = _same(str(src), tmp_path, dedup, workers=1)
    assert len(records) == {"none": 8, "exact": 5, "minhash": 4}[dedup]


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_multistream_dump_split_by_stream(multistream_dump, tmp_path, workers):
    units = plan_units(open_source(f"wikipedia:{multistream_dump}"))
    assert len(units) >= 2 and all(u.offset for u in units)
    records = _same(f"wikipedia:{multistream_dump}", tmp_path, "minhash", workers)
    assert [(r["id"], r["url"]) for r in records] == [
        ("1208", "https://en.wikipedia.org/wiki/Alan_Turing"),
        ("1211", "https://en.wikipedia.org/wiki/Ada_Lovelace"),
    ]


def test_corpus_folders(tmp_path, pubmed_gz):
    _same(f"gutenberg:{FIXTURES / 'gutenberg'}", tmp_path, "exact", workers=1)
    # PubMed's files are one unit (updates apply across files): task 1 reads nothing
    assert len(plan_units(open_source(f"pubmed:{pubmed_gz[0].parent}"))) == 1
    _same(f"pubmed:{pubmed_gz[0].parent}", tmp_path, "minhash", workers=1)


def test_task_shares_cover_units_once():
    for n in range(7):
        for world in range(1, 5):
            got = [i for r in range(world) for i in task_share(n, r, world)]
            assert got == list(range(n))


def test_cli_engine_local(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    src = _mixed_jsonl(tmp_path / "in")
    out = tmp_path / "out" / "o.jsonl"
    out.parent.mkdir()
    argv = ["extract", "--source", str(src), "--out", str(out), "--dedup", "minhash"]
    assert main([*argv, "--engine", "local", "--tasks", "2"]) == 0
    assert [r["text"][:10] for r in _lines(out)] == [
        "word0 word",
        "alpha alph",
        "beta gamma",
        "something ",
    ]
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.jsonl", "o.jsonl.report.json"]
    assert main([*argv, "--engine", "local", "--tasks", "0", "--force"]) == 1
    assert "tasks must be >= 1, got 0" in capsys.readouterr().err
