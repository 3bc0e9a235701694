"""Gutenberg reader: modern markers (with a wrapped title), the pre-2000s small-print marker in
a Latin-1 file with CRLF line ends, and a file without markers (skipped, counted)."""

from collections import Counter
from pathlib import Path

from ats_data.corpora.gutenberg import strip_boundaries
from ats_data.sources import open_source

BOOKS = Path(__file__).parents[1] / "fixtures" / "gutenberg"


def test_books_stripped_and_tagged():
    counts = Counter()
    docs = list(open_source(f"gutenberg:{BOOKS}").documents(counts))
    assert [(d.id, d.title, d.url) for d in docs] == [
        ("10001", "Old Tales", "https://www.gutenberg.org/ebooks/10001"),
        ("1342", "Pride and Prejudice", "https://www.gutenberg.org/ebooks/1342"),
    ]
    assert docs[0].text == "OLD TALES\n\nCaf\u00e9 society was na\u00efve."
    assert docs[1].text == (
        "PRIDE AND PREJUDICE\n\nChapter I.\n\nIt is a truth universally acknowledged, that a "
        "single man in possession\nof a good fortune, must be in want of a wife."
    )
    assert all("Public domain" in d.licence for d in docs)
    assert counts == {"gutenberg_no_start_marker": 1}  # notes.txt


def test_marker_variants():
    body = "\n\nText.\n\n"
    assert (
        strip_boundaries(
            f"*** START OF THIS PROJECT GUTENBERG EBOOK X ***{body}"
            "*** END OF THIS PROJECT GUTENBERG EBOOK X ***"
        )
        == "Text."
    )
    assert (
        strip_boundaries(
            f"***START OF THE PROJECT GUTENBERG EBOOK X***{body}"
            "End of the Project Gutenberg EBook of X"
        )
        == "Text."
    )
    assert strip_boundaries("no markers at all") is None
