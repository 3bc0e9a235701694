"""arXiv reader: the metadata snapshot (category filters, the default licence for a null
`license`) and a bulk source tar cleaned as RedPajama does (preamble, comments, bibliography and
appendix dropped, argument-free macros expanded, a paper without sections skipped)."""

from collections import Counter
from pathlib import Path

import pytest
from ats_data.corpora.arxiv import DEFAULT_LICENCE
from ats_data.errors import DataError
from ats_data.sources import open_source

META = Path(__file__).parents[1] / "fixtures" / "arxiv" / "arxiv-metadata-oai-snapshot.json"


def test_metadata_records():
    docs = list(open_source(str(META)).documents(Counter()))  # detected from the first line
    assert [(d.id, d.licence) for d in docs] == [
        ("0704.0001", DEFAULT_LICENCE),
        ("2301.00002", "http://creativecommons.org/licenses/by/4.0/"),
        ("2301.00003", "http://creativecommons.org/licenses/by-sa/4.0/"),
    ]
    assert docs[0].text == (
        "Calculation of prompt diphoton production cross sections at Tevatron and LHC energies"
        "\n\nA fully differential calculation in perturbative quantum chromodynamics is "
        "presented for the production of massive photon pairs."
    )
    assert docs[0].url == "https://arxiv.org/abs/0704.0001"


def test_category_filter():
    counts = Counter()
    docs = list(open_source(f"arxiv[cs.*,hep-ph]:{META}").documents(counts))
    assert [d.id for d in docs] == ["0704.0001", "2301.00002"]
    assert counts == {"arxiv_other_category": 1}


def test_latex_sources_cleaned_like_redpajama(arxiv_tar):
    counts = Counter()
    docs = list(open_source(f"arxiv:{arxiv_tar}").documents(counts))
    assert [d.id for d in docs] == ["2301.00002", "2301.00003"]
    assert (
        docs[0].text
        == (
            "\\section{Introduction}\nLet $x \\in \\mathbb{R}^n$ and $\\varepsilon > 0$. \n"  # the space before "% ..." stays
            "A literal 50\\% stays.\n\\input{sections}\n\n"
            "\\subsection{Method}\nWe use \\mathbb{R} and \\Rbig here."
        )
    )
    assert docs[1].text == "\\section*{Groups}\nEvery group of prime order is cyclic."
    assert counts == {"arxiv_no_section": 1}


def test_categories_need_metadata(arxiv_tar):
    with pytest.raises(DataError, match="category filters need the metadata snapshot"):
        list(open_source(f"arxiv[cs.CL]:{arxiv_tar}"))
