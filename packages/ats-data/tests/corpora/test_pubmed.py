"""PubMed reader: a baseline and an update file (gzipped as published) with a structured
abstract, inline markup and entities in the title, a retracted paper by publication type and one
by RetractionIn comment, a PMID updated and one deleted by the later file."""

from collections import Counter

import pytest
from ats_data.errors import DataError
from ats_data.sources import open_source

LIC = "NLM terms and conditions (abstracts may be under publisher copyright)"


def test_updates_deletions_and_retractions(pubmed_gz):
    counts = Counter()
    docs = list(open_source(f"pubmed:{pubmed_gz[0].parent}").documents(counts))
    assert [(d.id, d.url, d.licence) for d in docs] == [
        ("101", "https://pubmed.ncbi.nlm.nih.gov/101/", LIC),
        ("104", "https://pubmed.ncbi.nlm.nih.gov/104/", LIC),
        ("106", "https://pubmed.ncbi.nlm.nih.gov/106/", LIC),
    ]
    assert docs[0].title == "Effects of Escherichia coli on CO2 & \u03b1-levels."
    assert docs[0].text == (
        "Effects of Escherichia coli on CO2 & \u03b1-levels.\n\nBACKGROUND: Little is known."
        "\n\nMETHODS: We measured things twice.\n\nRESULTS: p < 0.05."
    )
    assert docs[1].text == "Second version.\n\nNew abstract."
    assert docs[2].text == "No abstract here."
    assert counts == {"pubmed_retracted": 2, "pubmed_superseded": 1, "pubmed_deleted": 1}


def test_baseline_alone_keeps_what_only_the_update_removes(pubmed_gz):
    docs = list(open_source(str(pubmed_gz[0])).documents(Counter()))  # detected by content
    assert [d.id for d in docs] == ["101", "103", "104"]


def test_truncated_gz_is_a_one_line_error(pubmed_gz):
    data = pubmed_gz[1].read_bytes()
    pubmed_gz[1].write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"pubmed25n0002\.xml\.gz: truncated compressed stream"):
        list(open_source(f"pubmed:{pubmed_gz[0].parent}"))
