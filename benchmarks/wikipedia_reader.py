"""ats-data's Wikipedia reader against WikiExtractor on the same pages-articles XML.bz2: articles
per second and MB/s of dump at 1 and 2 processes, and how far the two agree on the text.

The dump is written to the published schema (siteinfo with its namespaces, pages with ns, id,
revision, <redirect/>) from the prose of the Python standard library's docstrings, one article
per module, in the wikitext that real articles carry: a nested infobox, bold/italic, piped links,
<ref>s (named, reused, holding citation templates), a wikitable, [[File:...]] with a linked
caption, external links, comments, entities, lists, sections, categories and interlanguage
links; plus redirects and pages in the Talk, User, Template and Category namespaces, which both
tools must leave out.

WikiExtractor (pip `wikiextractor`) runs as its own CLI (`--json`, default template handling)
from a separate interpreter given by --wikiextractor-python (a throwaway venv:
`uv venv /tmp/wx && uv pip install --python /tmp/wx/bin/python wikiextractor`); its time is the
wall time of that process. Agreement is measured per article present in both outputs, on
normalised words (lower case, \\w+ runs): the fraction whose word sequences are equal, the mean
multiset F1 of their words, and each side's words found in the other's (mean per article).

Prints one JSON line per measurement.
Run: uv run --no-sync python benchmarks/wikipedia_reader.py --wikiextractor-python /tmp/wx/bin/python
     [--mb 5]
"""

import argparse
import ast
import bz2
import json
import re
import subprocess
import sysconfig
import tempfile
import time
from collections import Counter
from pathlib import Path
from xml.sax.saxutils import escape

from ats_data.sources import open_source

SITEINFO = """<siteinfo><sitename>Wikipedia</sitename><dbname>enwiki</dbname>
<base>https://en.wikipedia.org/wiki/Main_Page</base><generator>MediaWiki 1.43</generator>
<case>first-letter</case><namespaces>
<namespace key="-2" case="first-letter">Media</namespace>
<namespace key="-1" case="first-letter">Special</namespace>
<namespace key="0" case="first-letter" />
<namespace key="1" case="first-letter">Talk</namespace>
<namespace key="2" case="first-letter">User</namespace>
<namespace key="4" case="first-letter">Wikipedia</namespace>
<namespace key="6" case="first-letter">File</namespace>
<namespace key="10" case="first-letter">Template</namespace>
<namespace key="14" case="first-letter">Category</namespace>
</namespaces></siteinfo>
"""
WORDS = re.compile(r"\w+")


def module_docs(mb: float) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """(module name, [(section title, paragraphs)]) from stdlib docstrings (module, classes,
    functions, methods), about `mb` MB: the modules are taken again, renamed, when one pass over
    the stdlib holds less."""
    found, size = [], 0
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if {"test", "tests", "site-packages", "idle_test"} & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        sections = []
        for node in tree.body:
            inner = node.body if isinstance(node, ast.ClassDef) else []
            for item in [node, *inner]:
                doc = isinstance(item, ast.ClassDef | ast.FunctionDef) and ast.get_docstring(item)
                if doc:
                    paras = [p.strip() for p in doc.split("\n\n") if p.strip()]
                    name = item.name if item is node else f"{node.name}.{item.name}"
                    sections.append((name, paras))
        paras = [p.strip() for p in (ast.get_docstring(tree) or "").split("\n\n") if p.strip()]
        if not paras or len(sections) < 2:
            continue
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        found.append((name, [("", paras), *sections]))
        size += sum(len(p) for _, ps in found[-1][1] for p in ps)
        if size > mb * 1e6:
            return found
    out, copy = list(found), 1
    while size < mb * 1e6:
        copy += 1
        for name, sections in found:
            out.append((f"{name} {copy}", sections))
            size += sum(len(p) for _, ps in sections for p in ps)
            if size > mb * 1e6:
                break
    return out


def prose(text: str) -> str:
    """A docstring paragraph as wikitext prose: no markup characters of its own."""
    text = re.sub(r"[{}\[\]|<>=#*:;'&]", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def title_of(module: str) -> str:
    return module.replace("_", " ").strip().capitalize()


def article(name: str, sections: list[tuple[str, list[str]]], i: int) -> str:
    title = title_of(name)
    lines = [
        "{{Short description|Python standard library module}}",
        "{{Infobox software\n| name = " + title + "\n| developer = [[Python Software Foundation]]"
        "\n| released = {{Start date and age|2001|04|17|df=yes}}\n| language = {{hlist|[[C "
        "(programming language)|C]]|[[Python (programming language)|Python]]}}\n}}",
        f"'''{title}''' is a module of the ''[[Python (programming language)|Python]]'' standard "
        f'library.<ref name="docs{i}">{{{{cite web |url=https://docs.python.org/3/library/'
        f"{name}.html |title={title} |publisher=PSF}}}}</ref> <!-- lead checked --> It ships"
        f"&nbsp;with CPython&ndash;{i % 13}.",
    ]
    for s, (heading, paras) in enumerate(sections):
        if heading:
            lines.append(f"== {heading} ==")
        for p, para in enumerate(paras):
            words = prose(para).split(" ")
            if len(words) > 6:  # a piped link, a plain link and italic text inside the prose
                words[2] = f"[[{words[2]} (computing)|{words[2]}]]"
                words[4] = f"[[{words[4]}]]"
                words[6] = f"''{words[6]}''"
            text = " ".join(words)
            if p == 0 and s % 3 == 1:
                text += f'<ref name="docs{i}" />'
            if p == 1:
                text += "<ref>{{cite book |title=Python in a Nutshell |year=2017}}</ref>"
            lines.append(text)
        if s == 1:
            lines.append(
                f'{{| class="wikitable"\n! Name !! Kind\n|-\n| {title} || module\n|-\n'
                f"| {heading} || section\n|}}"
            )
            lines.append(f"[[File:{name}.svg|thumb|Layout of [[{title}]] objects]]")
            lines.append(f"* {heading} is documented.\n* See also [[{title}]].")
    lines += [
        "== References ==",
        "{{Reflist}}",
        "== External links ==",
        f"* [https://docs.python.org/3/library/{name}.html Official documentation]",
        "{{Python}}",
        "[[Category:Python standard library]]",
        f"[[de:{title}]]",
    ]
    return "\n\n".join(lines)


def page(title: str, ns: int, pid: int, text: str, redirect: str | None = None) -> str:
    """One <page> laid out as the dumps are: one element per line, the text's own lines kept."""
    redir = f'    <redirect title="{escape(redirect)}" />\n' if redirect else ""
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{pid}</id>\n"
        f"{redir}    <revision>\n      <id>{pid + 10_000_000}</id>\n"
        "      <timestamp>2025-01-01T00:00:00Z</timestamp>\n      <model>wikitext</model>\n"
        "      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}</text>\n'
        "    </revision>\n  </page>\n"
    )


def write_dump(mb: float, path: Path) -> tuple[Path, int]:
    """The dump at `path` and the number of articles (namespace 0, not redirects) in it."""
    pages, pid = [], 1
    pages.append(page("Template:Reflist", 10, pid, '<div class="reflist"><references /></div>'))
    for n, (name, sections) in enumerate(module_docs(mb)):
        title = title_of(name)
        pid += 1
        pages.append(page(title, 0, pid, article(name, sections, n)))
        if n % 5 == 0:
            pid += 1
            pages.append(page(f"{title} module", 0, pid, f"#REDIRECT [[{title}]]", title))
            pid += 1
            pages.append(page(f"Talk:{title}", 1, pid, f"== Sources ==\nIs {title} notable?"))
        if n % 7 == 0:
            pid += 1
            pages.append(page(f"Category:{title}", 14, pid, "[[Category:Python]]"))
            pid += 1
            pages.append(page(f"User:Editor{n}", 2, pid, f"I edit [[{title}]]."))
    xml = (
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" '
        'xml:lang="en">\n' + SITEINFO + "".join(pages) + "</mediawiki>\n"
    )
    path.write_bytes(bz2.compress(xml.encode()))
    return path, sum(1 for p in pages if "<ns>0</ns>" in p and "<redirect" not in p)


def ours(dump: Path, workers: int) -> tuple[dict[str, str], float]:
    source = open_source(f"wikipedia:{dump}")
    start = time.perf_counter()
    docs = {d.id: d.text for d in source.documents(Counter(), workers=workers)}
    return docs, time.perf_counter() - start


def wikiextractor(python: str, dump: Path, processes: int, out: Path) -> tuple[dict, float]:
    command = [python, "-m", "wikiextractor.WikiExtractor", str(dump), "-o", str(out), "--json",
               "--processes", str(processes), "-q"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    docs = {}
    for part in sorted(out.rglob("wiki_*")):
        for line in part.read_text(encoding="utf-8").splitlines():
            doc = json.loads(line)
            docs[doc["id"]] = doc["text"]
    return docs, seconds


def words(text: str) -> list[str]:
    return WORDS.findall(text.lower())


def agreement(a: dict[str, str], b: dict[str, str]) -> dict[str, float]:
    both = sorted(a.keys() & b.keys())
    equal, f1, in_ours, in_theirs = 0, 0.0, 0.0, 0.0
    for key in both:
        wa, wb = words(a[key]), words(b[key])
        equal += wa == wb
        common = sum((Counter(wa) & Counter(wb)).values())
        f1 += 2 * common / (len(wa) + len(wb)) if wa or wb else 1.0
        in_ours += common / len(wb) if wb else 1.0
        in_theirs += common / len(wa) if wa else 1.0
    return {
        "articles_ours": len(a),
        "articles_wikiextractor": len(b),
        "articles_in_both": len(both),
        "equal_words_fraction": round(equal / max(len(both), 1), 4),
        "mean_word_f1": round(f1 / max(len(both), 1), 4),
        "wikiextractor_words_in_ours": round(in_ours / max(len(both), 1), 4),
        "our_words_in_wikiextractor": round(in_theirs / max(len(both), 1), 4),
    }


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wikiextractor-python", required=True, help="python with wikiextractor")
    parser.add_argument("--mb", type=float, default=5.0, help="docstring text in the dump")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dump, n_articles = write_dump(args.mb, Path(tmp) / "enwiki-20250101-pages-articles.xml.bz2")
        dump_mb = dump.stat().st_size / 1e6
        xml_mb = len(bz2.decompress(dump.read_bytes())) / 1e6
        emit(name="dump", articles=n_articles, bz2_mb=round(dump_mb, 2), xml_mb=round(xml_mb, 2))
        results = {}
        for processes in (1, 2):
            mine, mine_s = ours(dump, processes)
            theirs, theirs_s = wikiextractor(
                args.wikiextractor_python, dump, processes, Path(tmp) / f"wx{processes}"
            )
            results[processes] = (mine, theirs)
            emit(
                name=f"read wikipedia, {processes} process(es)",
                ours_docs_per_s=round(len(mine) / mine_s, 1),
                wikiextractor_docs_per_s=round(len(theirs) / theirs_s, 1),
                ours_xml_mb_per_s=round(xml_mb / mine_s, 2),
                wikiextractor_xml_mb_per_s=round(xml_mb / theirs_s, 2),
                ratio=round(theirs_s / mine_s, 2),
            )
        mine, theirs = results[1]
        emit(name="agreement", expected_articles=n_articles, **agreement(mine, theirs))


if __name__ == "__main__":
    main()
