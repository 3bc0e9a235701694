"""ats-data corpus pipeline throughput on this machine: MB/s of input for each corpus reader,
MinHash signatures per second (ats-data's batched xxh64 + multiply-add-shift signatures vs
datatrove's MinhashDedupSignature hashing on the same documents, alternated --runs times in one
process), and end to end: `extract --dedup minhash` (read -> clean -> MinHash dedup -> JSONL) and
`prepare --dedup minhash` (read -> clean -> exact + MinHash dedup -> tokenize -> shards, with a
4096-token BPE trained on the same text first, not timed).

Inputs are synthetic dumps in each published format, built from the Python standard library's
text (deterministic), about --mb MB of uncompressed text each. WikiExtractor is not installed
here; datatrove has no Wikipedia XML reader of its own, so the reader rows have no baseline.
datatrove's signatures use its xxhash 64-bit shingle hashing and a whitespace word splitter.

Prints one JSON line per measurement: {"name", "ours", "baseline", "unit", "input_mb"}.
Run: uv run --no-sync python benchmarks/data_pipeline.py [--mb 20] [--runs 3] [--only minhash]
"""

import argparse
import bz2
import gzip
import json
import sysconfig
import tempfile
import time
from collections import Counter
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from ats_data.extract import extract
from ats_data.minhash import MinHashConfig, signatures
from ats_data.prepare import prepare
from ats_data.sources import open_source
from ats_tokenizer import Tokenizer


def paragraphs(mb: float) -> list[str]:
    out, size = [], 0
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")):
        for para in path.read_text(errors="replace").split("\n\n"):
            if len(para) > 200:
                out.append(para)
                size += len(para)
                if size > mb * 1e6:
                    return out
    return out


def wikipedia_dump(paras: list[str], path: Path) -> Path:
    pages = []
    for i in range(0, len(paras), 4):
        body = "\n\n".join(paras[i : i + 4])
        wikitext = (
            f"{{{{Infobox|name={{{{nowrap|P{i}}}}}}}}}'''Page {i}''' links [[Python|code]] and "
            f"[[File:X.png|thumb|a [[caption]]]].<ref>{{{{cite web|url=x}}}}</ref>\n== Body ==\n"
            f"{body}\n[[Category:Code]]"
        )
        pages.append(
            f"<page><title>Page {i}</title><ns>0</ns><id>{i + 1}</id><revision><id>{i}</id>"
            f'<text xml:space="preserve">{escape(wikitext)}</text></revision></page>\n'
        )
    xml = (
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/"><siteinfo><base>'
        "https://en.wikipedia.org/wiki/Main_Page</base></siteinfo>\n"
        + "".join(pages)
        + "</mediawiki>"
    )
    path.write_bytes(bz2.compress(xml.encode()))
    return path


def pubmed_dump(paras: list[str], path: Path) -> Path:
    arts = [
        f"<PubmedArticle><MedlineCitation><PMID Version='1'>{i + 1}</PMID><Article>"
        f"<ArticleTitle>Title {i}</ArticleTitle><Abstract><AbstractText Label='BACKGROUND'>"
        f"{escape(p)}</AbstractText></Abstract></Article></MedlineCitation></PubmedArticle>\n"
        for i, p in enumerate(paras)
    ]
    xml = "<PubmedArticleSet>\n" + "".join(arts) + "</PubmedArticleSet>"
    path.write_bytes(gzip.compress(xml.encode()))
    return path


def posts_xml(paras: list[str], folder: Path) -> Path:
    folder.mkdir(parents=True)
    rows = []
    for i, p in enumerate(paras):
        html = f"<p>{escape(p[:100])}</p><pre><code>{escape(p[100:])}</code></pre>"
        if i % 3 == 0:
            rows.append(
                f'<row Id="{i + 1}" PostTypeId="1" CreationDate="2015-01-01T00:00:00.000" '
                f'Score="1" Body={quoteattr(html)} Title="Q{i}" Tags="&lt;py&gt;" />'
            )
        else:
            rows.append(
                f'<row Id="{i + 1}" PostTypeId="2" ParentId="{i - i % 3 + 1}" Score="{i % 7}" '
                f'CreationDate="2019-01-01T00:00:00.000" Body={quoteattr(html)} />'
            )
    (folder / "Posts.xml").write_text("<posts>\n" + "\n".join(rows) + "\n</posts>")
    return folder / "Posts.xml"


def gutenberg_books(paras: list[str], folder: Path) -> Path:
    folder.mkdir()
    for b in range(0, len(paras), 200):
        body = "\n\n".join(paras[b : b + 200])
        (folder / f"pg{b + 1}.txt").write_text(
            f"Title: Book {b}\n\n*** START OF THE PROJECT GUTENBERG EBOOK {b} ***\n\n{body}\n\n"
            f"*** END OF THE PROJECT GUTENBERG EBOOK {b} ***\nlicence text\n"
        )
    return folder


def arxiv_meta(paras: list[str], path: Path) -> Path:
    with path.open("w") as f:
        for i, p in enumerate(paras):
            rec = {
                "id": f"2301.{i:05d}",
                "title": f"T{i}",
                "abstract": p,
                "categories": "cs.CL",
                "license": None,
            }
            f.write(json.dumps(rec) + "\n")
    return path


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def emit(name: str, ours: float, baseline: float | None, unit: str, input_mb: float) -> None:
    row = {
        "name": name,
        "ours": round(ours, 2),
        "baseline": baseline,
        "unit": unit,
        "input_mb": round(input_mb, 2),
    }
    print(json.dumps(row), flush=True)


def datatrove_signatures(texts: list[str]) -> float:
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
    from datatrove.utils.word_tokenizers import WordTokenizer

    class SplitWords(WordTokenizer):
        """Whitespace words, as ats-data splits them (datatrove's defaults need spaCy)."""

        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    step = MinhashDedupSignature(
        output_folder=tempfile.mkdtemp(), config=MinhashConfig(), language=SplitWords()
    )

    def run() -> None:
        for t in texts:
            shingles = step.get_shingles(t)
            if shingles.size:  # datatrove's run() skips a document with no 5-gram as well
                step.get_signature(shingles)

    _, seconds = timed(run)
    return len(texts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3, help="MinHash rows: runs of each side")
    parser.add_argument("--only", choices=("readers", "minhash", "end2end"), default=None)
    args = parser.parse_args()
    paras = paragraphs(args.mb)
    text_mb = sum(len(p) for p in paras) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        specs = {
            "wikipedia": f"wikipedia:{wikipedia_dump(paras, tmp / 'enwiki-pages-articles.xml.bz2')}",
            "pubmed": f"pubmed:{pubmed_dump(paras, tmp / 'pubmed25n0001.xml.gz')}",
            "stackexchange": f"stackexchange:{posts_xml(paras, tmp / 'se' / 'x.stackexchange.com')}",
            "gutenberg": f"gutenberg:{gutenberg_books(paras, tmp / 'gut')}",
            "arxiv": f"arxiv:{arxiv_meta(paras, tmp / 'arxiv-metadata-oai-snapshot.json')}",
        }
        if args.only in (None, "readers"):
            readers(specs, text_mb)
        if args.only in (None, "minhash"):
            minhash_rows(paras[:4000], args.runs)
        if args.only in (None, "end2end"):
            for workers in (1, 2):
                out = tmp / f"wiki-{workers}.jsonl"
                report, seconds = timed(
                    lambda out=out, w=workers: extract(
                        specs["wikipedia"], out, dedup="minhash", workers=w
                    )
                )
                emit(
                    f"end to end: wikipedia extract --dedup minhash --workers {workers} "
                    "(MB/s of text)",
                    text_mb / seconds,
                    None,
                    "MB/s",
                    text_mb,
                )
            tokenizer = tmp / "tokenizer.json"
            Tokenizer.train(paras[:2000], 4096).save(tokenizer)
            for workers in (1, 2):
                out = tmp / f"prepared-{workers}"
                _, seconds = timed(
                    lambda out=out, w=workers: prepare(
                        specs["wikipedia"], tokenizer, out, workers=w, dedup="minhash"
                    )
                )
                emit(
                    f"end to end: wikipedia prepare --dedup minhash --workers {workers} "
                    "(MB/s of text)",
                    text_mb / seconds,
                    None,
                    "MB/s",
                    text_mb,
                )


def readers(specs: dict[str, str], text_mb: float) -> None:
    for name, spec in specs.items():
        path = Path(spec.split(":", 1)[1])
        src = open_source(spec)
        docs, seconds = timed(lambda src=src: sum(1 for _ in src.documents(Counter())))
        emit(
            f"read {name} (MB/s of file, {docs} docs)",
            size_mb(path) / seconds,
            None,
            "MB/s",
            size_mb(path),
        )
        emit(f"read {name} (MB/s of text)", text_mb / seconds, None, "MB/s", text_mb)
    src = open_source(specs["wikipedia"])
    _, seconds = timed(lambda: sum(1 for _ in src.documents(Counter(), workers=2)))
    emit(
        "read wikipedia, 2 worker processes (MB/s of text)",
        text_mb / seconds,
        None,
        "MB/s",
        text_mb,
    )


def minhash_rows(texts: list[str], runs: int) -> None:
    config = MinHashConfig()
    input_mb = sum(map(len, texts)) / 1e6
    for run in range(runs):
        _, seconds = timed(lambda: sum(1 for _ in signatures(texts, config, 1)))
        emit(
            f"MinHash signatures, 1 process (docs/s), run {run + 1}",
            len(texts) / seconds,
            round(datatrove_signatures(texts), 1),
            "docs/s",
            input_mb,
        )
    _, seconds = timed(lambda: sum(1 for _ in signatures(texts, config, 2)))
    emit("MinHash signatures, 2 processes (docs/s)", len(texts) / seconds, None, "docs/s", input_mb)


if __name__ == "__main__":
    main()
