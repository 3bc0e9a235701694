"""Wikipedia reader: the fixture dump (nested templates, refs, a table, files, categories,
entities escaped once and twice, CDATA, redirects, another namespace) against hand-written
expected text; the multistream container and its index offsets; bad input."""

import bz2
from collections import Counter
from pathlib import Path

import pytest
from ats_data.corpora import wikipedia
from ats_data.corpora.wikipedia import multistream_offsets, read_stream, wikitext_to_text
from ats_data.errors import DataError
from ats_data.sources import open_source

FIXTURE = (
    Path(__file__).parents[1] / "fixtures" / "wikipedia" / "enwiki-20240601-pages-articles.xml"
)

TURING = (
    "Alan Mathison Turing (23 June 1912 \u2013 7 June 1954) was an English mathematician and "
    "computer scientist. He was highly influential.\n\n"
    "Early life\n\n"
    "Turing was born in Maida Vale, London. His IQ&wit were noted <b> early.\n\n"
    "First item with an external link\n"
    "Second item, energy E = mc2, formula\n\n"
    "Legacy\n\n"
    "See the category and . A CDATA tail & <kept> verbatim."
)
LOVELACE = (
    "Augusta Ada King was an English mathematician and writer, chiefly known for her work on "
    "Charles Babbage's Analytical Engine."
)


def test_fixture_dump_gives_the_expected_articles():
    counts = Counter()
    docs = list(wikipedia.read(FIXTURE, counts))
    assert [(d.id, d.title, d.url, d.licence) for d in docs] == [
        ("1208", "Alan Turing", "https://en.wikipedia.org/wiki/Alan_Turing", "CC-BY-SA-4.0"),
        ("1211", "Ada Lovelace", "https://en.wikipedia.org/wiki/Ada_Lovelace", "CC-BY-SA-4.0"),
    ]
    assert [d.text for d in docs] == [TURING, LOVELACE]
    # <redirect/> and a lower-case "#redirect" text; the Talk page is namespace 1
    assert counts == {"wikipedia_redirect": 2, "wikipedia_other_namespace": 1}


@pytest.mark.parametrize(
    ("wikitext", "text"),
    [
        ("a {{x|{{y|{{z}}}}}} b", "a b"),
        ("[[File:X.png|thumb|caption with [[link]]]]kept", "kept"),
        ("[[Target|label]] and [[plain]]s", "label and plains"),
        ("x<ref group=n>{{cite|a=1}}</ref>y<ref name=r/>z", "xyz"),
        ("<!-- c -->v &ndash; w", "v \u2013 w"),
        ("== H ==\nbody", "H\n\nbody"),
    ],
)
def test_wikitext_cases(wikitext, text):
    assert wikitext_to_text(wikitext) == text


def test_multistream_reads_as_one_dump_and_by_offsets(multistream_dump):
    whole = list(open_source(str(multistream_dump)).documents(Counter()))  # detected
    assert [d.text for d in whole] == [TURING, LOVELACE]
    index = multistream_dump.with_name(multistream_dump.name.replace(".xml.bz2", "-index.txt.bz2"))
    offsets = multistream_offsets(index)
    # 5 pages at 2 a stream, after the header stream
    header_len = len(
        bz2.compress(FIXTURE.read_text()[: FIXTURE.read_text().index("</siteinfo>") + 12].encode())
    )
    assert offsets[0] == header_len and len(offsets) == 3
    by_stream = [
        [
            d.title
            for d in read_stream(multistream_dump, o, Counter(), "https://en.wikipedia.org/wiki/")
        ]
        for o in offsets
    ]
    assert by_stream == [["Alan Turing"], ["Ada Lovelace"], []]
    first = next(
        read_stream(multistream_dump, offsets[0], Counter(), "https://en.wikipedia.org/wiki/")
    )
    assert first.text == TURING and first.url == whole[0].url


def test_parallel_conversion_gives_the_same_documents(multistream_dump):
    serial = list(open_source(f"wikipedia:{multistream_dump}").documents(Counter()))
    parallel = list(open_source(f"wikipedia:{multistream_dump}").documents(Counter(), workers=2))
    assert [d.to_json() for d in parallel] == [d.to_json() for d in serial]


def test_truncated_bz2_is_a_one_line_error(multistream_dump, tmp_path):
    data = multistream_dump.read_bytes()
    cut = tmp_path / "enwiki-cut-pages-articles.xml.bz2"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(
        DataError, match=r"enwiki-cut-pages-articles\.xml\.bz2: truncated compressed stream"
    ):
        list(open_source(f"wikipedia:{cut}").documents(Counter()))


def test_corrupt_bz2_and_malformed_xml(tmp_path):
    bad = tmp_path / "x-pages-articles.xml.bz2"
    bad.write_bytes(b"BZh9" + b"\x00" * 64)
    with pytest.raises(DataError, match="corrupt compressed data"):
        list(open_source(f"wikipedia:{bad}"))
    xml = tmp_path / "y-pages-articles.xml"
    xml.write_text("<mediawiki><page><title>A</title><ns>0</ns></pag></mediawiki>")
    with pytest.raises(
        DataError,
        match=r"y-pages-articles\.xml: malformed XML at line 1 column 46: mismatched tag$",
    ):
        list(open_source(f"wikipedia:{xml}"))


def test_wrong_file_types_are_named(tmp_path):
    archive = tmp_path / "dump.7z"
    archive.write_bytes(b"7z\xbc\xaf\x27\x1c" + b"\x00" * 32)
    with pytest.raises(DataError, match=r"dump\.7z is a 7z archive; unpack it first"):
        list(open_source(f"wikipedia:{archive}"))
    unknown = tmp_path / "data.xml"
    unknown.write_text("<catalog><item/></catalog>")
    with pytest.raises(DataError, match=r"unknown source format '\.xml'.*wikipedia:PATH"):
        open_source(str(unknown))
