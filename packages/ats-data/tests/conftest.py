"""Shared fixtures: a tokenizer trained on a small standard-library slice (session-scoped)."""

from pathlib import Path

import numpy as np
import pytest
from ats_data.shards import ShardWriter, make_index, token_dtype_name, write_index
from ats_data.sources import open_source
from ats_tokenizer import Tokenizer

TOKENIZER_CORPUS = "stdlib:json"
TOKENIZER_VOCAB = 384


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory) -> Path:
    texts = list(open_source(TOKENIZER_CORPUS))
    tokenizer = Tokenizer.train(texts, vocab_size=TOKENIZER_VOCAB)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path):
    return Tokenizer.load(tokenizer_path)


def write_token_dataset(
    out_dir: Path,
    docs: dict[str, list[np.ndarray]],
    *,
    vocab_size: int,
    eos_id: int,
    shard_tokens: int = 1 << 20,
) -> Path:
    """A dataset folder from given token documents (each must end with eos_id), written by the
    same ShardWriter and index code prepare uses; for loader and dataset tests that need exact
    control of the token values."""
    dtype_name = token_dtype_name(vocab_size)
    shards = {}
    for split, split_docs in docs.items():
        writer = ShardWriter(out_dir, split, dtype_name, shard_tokens)
        for doc in split_docs:
            writer.add(np.asarray(doc))
        shards[split] = writer.close()
    index = make_index(
        tokenizer_sha256="0" * 64,
        vocab_size=vocab_size,
        eos_id=eos_id,
        dtype_name=dtype_name,
        shards=shards,
        source="test",
        cache_key="test",
        config={},
        stats={},
    )
    write_index(out_dir, index)
    return out_dir


@pytest.fixture
def make_token_dataset():
    return write_token_dataset


# --- corpus dumps: the committed fixtures (tests/fixtures/*) in their published containers ---

FIXTURES = Path(__file__).parent / "fixtures"


def write_multistream(xml_path: Path, out_dir: Path, pages_per_stream: int = 2) -> Path:
    """A pages-articles-multistream.xml.bz2 and its index, made as Wikimedia makes them: the
    header (through </siteinfo>) is one bz2 stream, then every `pages_per_stream` pages one
    stream, then the closing tag one stream; index lines are `offset:page_id:title`."""
    import bz2
    import re

    xml = xml_path.read_text(encoding="utf-8")
    head_end = xml.index("</siteinfo>") + len("</siteinfo>\n")
    pages = re.findall(r"  <page>.*?</page>\n", xml, flags=re.DOTALL)
    tail = xml[xml.rindex("</mediawiki>") :]
    dump = out_dir / xml_path.name.replace("pages-articles", "pages-articles-multistream")
    dump = dump.with_name(dump.name + ".bz2")
    index_lines = []
    with dump.open("wb") as f:
        f.write(bz2.compress(xml[:head_end].encode()))
        for i in range(0, len(pages), pages_per_stream):
            offset = f.tell()
            group = pages[i : i + pages_per_stream]
            for page in group:
                page_id = re.search(r"<id>(\d+)</id>", page).group(1)
                title = re.search(r"<title>(.*?)</title>", page).group(1)
                index_lines.append(f"{offset}:{page_id}:{title}\n")
            f.write(bz2.compress("".join(group).encode()))
        f.write(bz2.compress(tail.encode()))
    index = dump.with_name(dump.name.replace(".xml.bz2", "-index.txt.bz2"))
    index.write_bytes(bz2.compress("".join(index_lines).encode()))
    return dump


def write_arxiv_tar(out_dir: Path) -> Path:
    """A bulk source tar as arXiv ships them: members `YYMM/ID.gz`, each a gzipped tar of the
    paper's files or one gzipped .tex file."""
    import gzip
    import io
    import tarfile

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    src = FIXTURES / "arxiv"
    paper = io.BytesIO()
    with tarfile.open(fileobj=paper, mode="w") as inner:
        for tex in sorted((src / "2301.00002").iterdir()):
            add(inner, tex.name, tex.read_bytes())
        add(inner, "fig1.png", b"\x89PNG not text")
    bulk = out_dir / "arXiv_src_2301_001.tar"
    with tarfile.open(bulk, mode="w") as tar:
        add(tar, "2301/2301.00002.gz", gzip.compress(paper.getvalue()))
        add(tar, "2301/2301.00003.gz", gzip.compress((src / "2301.00003.tex").read_bytes()))
        add(tar, "2301/2301.00004.gz", gzip.compress((src / "2301.00004.tex").read_bytes()))
    return bulk


def gzip_copies(paths: list[Path], out_dir: Path) -> list[Path]:
    import gzip

    out = []
    for p in paths:
        dst = out_dir / (p.name + ".gz")
        dst.write_bytes(gzip.compress(p.read_bytes()))
        out.append(dst)
    return out


@pytest.fixture
def multistream_dump(tmp_path) -> Path:
    return write_multistream(
        FIXTURES / "wikipedia" / "enwiki-20240601-pages-articles.xml", tmp_path
    )


@pytest.fixture
def arxiv_tar(tmp_path) -> Path:
    return write_arxiv_tar(tmp_path)


@pytest.fixture
def pubmed_gz(tmp_path) -> list[Path]:
    return gzip_copies(sorted((FIXTURES / "pubmed").iterdir()), tmp_path)
