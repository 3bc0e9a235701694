"""A Wikipedia dump (pages-articles XML, bz2) as data.source: wikitext converted, tokenizer
trained, shards prepared with licence/source counts in index.json, and a short training run."""

import bz2
import json
import sysconfig
from pathlib import Path
from xml.sax.saxutils import escape

from ats_data.shards import INDEX_NAME
from ats_train.cli import main
from ats_train.metrics import read_metrics


def _dump(path: Path, paragraphs: list[str]) -> Path:
    pages = []
    for i, para in enumerate(paragraphs):
        wikitext = (
            f"{{{{Infobox|n={i}}}}}'''Page {i}''' is about [[Python|code]].<ref>r</ref>\n{para}"
        )
        pages.append(
            f"  <page>\n    <title>Page {i}</title>\n    <ns>0</ns>\n    <id>{i + 1}</id>\n"
            f"    <revision>\n      <id>{i + 100}</id>\n"
            f'      <text xml:space="preserve">{escape(wikitext)}</text>\n'
            "    </revision>\n  </page>\n"
        )
    redirect = (
        "  <page>\n    <title>Alias</title>\n    <ns>0</ns>\n    <id>9999</id>\n"
        '    <redirect title="Page 0" />\n    <revision><id>1</id>'
        '<text xml:space="preserve">#REDIRECT [[Page 0]]</text></revision>\n  </page>\n'
    )
    xml = (
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11">\n'
        "  <siteinfo>\n    <base>https://en.wikipedia.org/wiki/Main_Page</base>\n  </siteinfo>\n"
        + "".join(pages)
        + redirect
        + "</mediawiki>\n"
    )
    path.write_bytes(bz2.compress(xml.encode()))
    return path


def test_wikipedia_dump_to_shards_to_training(overrides, tmp_path: Path) -> None:
    text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    paragraphs = [p for p in text.split("\n\n") if len(p) > 200][:120]
    dump = _dump(tmp_path / "enwiki-20240601-pages-articles.xml.bz2", paragraphs)
    cache = tmp_path / "cache"
    args = overrides(
        data__source=f"wikipedia:{dump}",
        data__tokenizer="none",
        data__vocab_size=300,
        data__val_fraction=0.2,
        data__cache_dir=cache,
        train__steps=3,
        checkpoint__every=0,
    )
    assert main(["--run-dir", str(tmp_path / "run"), *args]) == 0
    (shards,) = (cache / "shards").iterdir()
    index = json.loads((shards / INDEX_NAME).read_text())
    kept = index["splits"]["train"]["num_docs"] + index["splits"]["val"]["num_docs"]
    assert index["stats"]["documents_read"] == len(paragraphs)
    assert index["stats"]["skipped"] == {"wikipedia_redirect": 1}
    assert index["stats"]["licences"] == {"CC-BY-SA-4.0": kept}
    assert index["stats"]["sources"] == {"wikipedia": kept}
    losses = [r["loss"] for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(losses) == 3 and all(loss == loss for loss in losses)
