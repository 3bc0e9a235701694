"""PubMed baseline and update files (`pubmed25n0001.xml.gz`, ...): one document per citation,
title + abstract (the sections of a structured abstract joined as "LABEL: text" paragraphs), id
= PMID. Files are read in name order, as NLM publishes them: a citation in a later file replaces
the earlier version of the same PMID, and `<DeleteCitation>` PMIDs are removed wherever they
appeared. Retracted papers (publication type "Retracted Publication", or a "RetractionIn"
comment) are dropped; both are counted.

Honouring a deletion at the end of the last update file means knowing it before writing the
first baseline document, so reading is two passes: the first collects (PMID, file) pairs and the
deletions into integer arrays (16 bytes a citation, no text); the second yields each PMID's last
version unless deleted.
"""

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ats_data.corpora.dumpfile import element_text, iter_xml, local_name, open_dump
from ats_data.document import Document
from ats_data.errors import DataError

LICENCE = "NLM terms and conditions (abstracts may be under publisher copyright)"


def _citations(path: Path) -> Iterator[tuple[str, ET.Element | None]]:
    """('article', <PubmedArticle>) and ('delete', <DeleteCitation>) elements of one file;
    each element is cleared after the caller has seen it."""
    root = None
    with open_dump(path) as f:
        for event, elem in iter_xml(path, f):
            if root is None:
                root = elem
                if local_name(elem.tag) not in ("PubmedArticleSet", "PubmedBookArticleSet"):
                    raise DataError(
                        f"{path}: not a PubMed XML file (root element <{local_name(elem.tag)}>, "
                        "expected <PubmedArticleSet>)"
                    )
            if event != "end":
                continue
            if elem.tag == "PubmedArticle":
                yield "article", elem
                root.clear()
            elif elem.tag == "DeleteCitation":
                yield "delete", elem
                root.clear()


def _pmid(article: ET.Element, path: Path) -> int:
    node = article.find("MedlineCitation/PMID")
    if node is None or not (node.text or "").strip().isdigit():
        raise DataError(f"{path}: a PubmedArticle without a numeric MedlineCitation/PMID")
    return int(node.text)


def _live_versions(paths: Sequence[Path], counts: Counter) -> tuple[np.ndarray, np.ndarray]:
    """Sorted PMIDs and, for each, the index of the file holding its last version, deleted
    PMIDs left out."""
    pmids: list[np.ndarray] = []
    files: list[np.ndarray] = []
    deleted: list[int] = []
    for i, path in enumerate(paths):
        seen: list[int] = []
        for kind, elem in _citations(path):
            if kind == "article":
                seen.append(_pmid(elem, path))
            else:
                deleted.extend(int(p.text) for p in elem.iter("PMID") if (p.text or "").isdigit())
        pmids.append(np.array(seen, dtype=np.int64))
        files.append(np.full(len(seen), i, dtype=np.int32))
    all_pmids = np.concatenate(pmids) if pmids else np.zeros(0, np.int64)
    all_files = np.concatenate(files) if files else np.zeros(0, np.int32)
    # last occurrence of each PMID: stable sort by PMID keeps file order within equal PMIDs
    order = np.argsort(all_pmids, kind="stable")
    sorted_pmids, sorted_files = all_pmids[order], all_files[order]
    last = np.r_[sorted_pmids[1:] != sorted_pmids[:-1], True] if len(order) else order.astype(bool)
    counts["pubmed_superseded"] += int(len(order) - last.sum())
    live_pmids, live_files = sorted_pmids[last], sorted_files[last]
    if deleted:
        keep = ~np.isin(live_pmids, np.array(deleted, dtype=np.int64))
        counts["pubmed_deleted"] += int((~keep).sum())
        live_pmids, live_files = live_pmids[keep], live_files[keep]
    return live_pmids, live_files


def is_retracted(article: ET.Element) -> bool:
    types = {element_text(t).strip() for t in article.iter("PublicationType")}
    if "Retracted Publication" in types:
        return True
    return any(c.get("RefType") == "RetractionIn" for c in article.iter("CommentsCorrections"))


def abstract_text(article: ET.Element) -> str:
    parts = []
    for node in article.findall("MedlineCitation/Article/Abstract/AbstractText"):
        text = " ".join(element_text(node).split())
        label = node.get("Label")
        if text:
            parts.append(f"{label}: {text}" if label else text)
    return "\n\n".join(parts)


def _document(article: ET.Element, pmid: int) -> Document:
    title = " ".join(element_text(article.find("MedlineCitation/Article/ArticleTitle")).split())
    abstract = abstract_text(article)
    return Document(
        text="\n\n".join(p for p in (title, abstract) if p),
        source="pubmed",
        id=str(pmid),
        title=title,
        url=f"https://pubmed.ncbi.nlm.nih.gov/{pmid}/",
        licence=LICENCE,
    )


def read(paths: Sequence[Path], counts: Counter) -> Iterator[Document]:
    """Documents of a set of baseline/update files, read in name order."""
    paths = sorted(paths, key=lambda p: p.name)
    pass_counts: Counter = Counter()
    live_pmids, live_files = _live_versions(paths, pass_counts)
    counts.update(pass_counts)
    for i, path in enumerate(paths):
        for kind, elem in _citations(path):
            if kind != "article":
                continue
            pmid = _pmid(elem, path)
            at = np.searchsorted(live_pmids, pmid)
            if at == len(live_pmids) or live_pmids[at] != pmid or live_files[at] != i:
                continue  # deleted, or superseded by a later file (counted in the first pass)
            if is_retracted(elem):
                counts["pubmed_retracted"] += 1
                continue
            yield _document(elem, pmid)
