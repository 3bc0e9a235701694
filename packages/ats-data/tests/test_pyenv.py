"""The pyenv source over a small fake environment: which files it takes, in a deterministic order
whatever the creation order, undecodable files skipped and counted, and prepare holding out whole
files (each val document is exactly one file's text)."""

import os
import sysconfig
from collections import Counter
from pathlib import Path

import ats_data.sources
import pytest
from ats_data.dataset import ShardDataset
from ats_data.prepare import prepare
from ats_data.pyenv import pyenv_files, pyenv_roots
from ats_data.sources import open_source
from ats_tokenizer import Tokenizer

# (relative path under the fake env, content); the env has a stdlib folder and one site folder
FILES = {
    "lib/os.py": "import sys\n",
    "lib/json/__init__.py": "from .decoder import JSONDecoder\n",
    "lib/json/README.rst": "json\n====\n\nThe json package.\n",
    "lib/test/test_os.py": "def test_os():\n    pass\n",  # stdlib tests are kept
    "lib/site-packages/other.py": "in another env's site-packages\n",  # skipped
    "lib/__pycache__/os.py": "not a source\n",  # skipped
    "lib/notes.txt": "not .py/.md/.rst\n",  # skipped
    "site/zpkg/core.py": "VALUE = 1\n",
    "site/apkg/README.md": "# apkg\n\nA package.\n",
    "site/apkg/__init__.py": "# coding: latin-1\nNAME = 'caf\xe9'\n",
    "site/apkg/broken.py": b"x = '\xff\xfe'\n",  # no cookie: not UTF-8, skipped and counted
}
EXPECTED = [
    "lib/json/README.rst",
    "lib/json/__init__.py",
    "lib/os.py",
    "lib/test/test_os.py",
    "site/apkg/README.md",
    "site/apkg/__init__.py",
    "site/apkg/broken.py",
    "site/zpkg/core.py",
]


def make_env(root: Path, order: list[str]) -> tuple[Path, list[Path]]:
    for rel in order:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        content = FILES[rel]
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content.startswith("# coding: latin-1"):
            path.write_bytes(content.encode("latin-1"))
        else:
            path.write_text(content, encoding="utf-8")
    (root / "site" / "loop").symlink_to(root / "site")  # a symlinked folder is not followed
    return root / "lib", [root / "site"]


@pytest.fixture
def fake_env(tmp_path, monkeypatch) -> Path:
    roots = make_env(tmp_path, list(FILES))
    monkeypatch.setattr(ats_data.sources, "pyenv_roots", lambda: roots)
    return tmp_path


def test_files_stdlib_then_site_sorted_whatever_the_creation_order(tmp_path):
    listings = []
    for name, order in [("one", list(FILES)), ("two", list(reversed(FILES)))]:
        found = pyenv_files(*make_env(tmp_path / name, order))
        listings.append([p.relative_to(tmp_path / name).as_posix() for p, _ in found])
        kinds = {p.suffix: kind for p, kind in found}
        assert kinds == {".py": "python", ".md": "text", ".rst": "text"}
    assert listings == [EXPECTED, EXPECTED]


def test_documents_are_whole_files_and_undecodable_ones_are_counted(fake_env):
    src = open_source("pyenv")
    assert src.describe() == (
        f"pyenv: {len(EXPECTED)} files, "
        f"{sum(len(FILES[r]) for r in EXPECTED) / 1e6:.1f} MB"  # latin-1: one byte a char
    )
    counts = Counter()
    texts = [doc.text for doc in src.documents(counts)]
    expected = [FILES[r] for r in EXPECTED if r != "site/apkg/broken.py"]
    assert texts == expected  # the latin-1 file decoded per its cookie
    assert counts == Counter({"undecodable file": 1})
    assert src.fingerprint() == open_source("pyenv").fingerprint()


def test_prepare_holds_out_whole_files(fake_env, tmp_path):
    # 60 more files, so that a val fraction of 0.3 puts some in each split
    extra = {f"site/gen/m{i:02d}.py": f"def f{i}(x):\n    return x * {i}\n" for i in range(60)}
    for rel, text in extra.items():
        (fake_env / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake_env / rel).write_text(text, encoding="utf-8")
    texts = [FILES[r] for r in EXPECTED if r != "site/apkg/broken.py"] + list(extra.values())
    tok_path = tmp_path / "tok.json"
    Tokenizer.train(texts, vocab_size=300).save(tok_path)
    out = prepare("pyenv", tok_path, tmp_path / "out", val_fraction=0.3, workers=1)
    ds = ShardDataset(out)
    tok = Tokenizer.load(tok_path)
    split_docs = {
        split: sorted(tok.decode(doc[:-1].tolist()) for doc in ds.documents(split))
        for split in ("train", "val")
    }
    assert 0 < len(split_docs["val"]) < len(texts)
    assert sorted(split_docs["train"] + split_docs["val"]) == sorted(texts)
    assert ds.index["stats"]["skipped"] == {"undecodable file": 1}


def test_roots_are_this_interpreters():
    stdlib, sites = pyenv_roots()
    assert stdlib == Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(sysconfig.get_paths()["purelib"]).resolve() in sites
    assert all(os.path.isdir(s) for s in sites)
