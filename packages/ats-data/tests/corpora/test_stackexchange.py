"""StackExchange reader: the fixture Posts.xml (answers before and after other questions, a tag
wiki post, HTML entities escaped twice, code blocks) against expected text and licences."""

from collections import Counter
from pathlib import Path

import pytest
from ats_data.corpora.stackexchange import html_to_text, licence_for
from ats_data.errors import DataError
from ats_data.sources import open_source

DUMP = Path(__file__).parents[1] / "fixtures" / "stackexchange"

PASTA = (
    "Pasta sticks & clumps\n\n"
    "How do I keep pasta from sticking? I tried `oil & salt`.\n\n"
    # answers by score: 7, then the two with score 2 in Id order
    "Use a big pot:\n\n```\nif water < 4 * pasta:\n    use_bigger_pot()\n```\n\n- one\n- two\n\n"
    "Stir in the first minute.\n\n"
    "Plain \u00e9 bold\nline two"
)


def test_questions_joined_with_answers_by_score():
    counts = Counter()
    docs = list(open_source(f"stackexchange:{DUMP}").documents(counts))
    assert [d.id for d in docs] == ["cooking.stackexchange.com/1", "cooking.stackexchange.com/2"]
    assert docs[0].text == PASTA
    assert docs[0].url == "https://cooking.stackexchange.com/questions/1"
    assert docs[0].licence == "CC-BY-SA-2.5, CC-BY-SA-3.0, CC-BY-SA-4.0"
    assert docs[0].meta == {"tags": ["pasta", "boiling"], "answers": 3}
    assert docs[1].text == "Unanswered\n\nIs this question ever answered?"
    assert docs[1].licence == "CC-BY-SA-3.0" and docs[1].meta["tags"] == ["baking"]
    assert counts == {"stackexchange_other_post_type": 1, "stackexchange_unanswered": 1}


def test_site_selection_and_detection():
    posts = DUMP / "cooking.stackexchange.com" / "Posts.xml"
    assert len(list(open_source(f"stackexchange[cooking.stackexchange.com]:{DUMP}"))) == 2
    assert open_source(str(posts)).files[0].kind == "stackexchange"
    with pytest.raises(DataError, match="no Posts.xml for site.*math.stackexchange.com"):
        open_source(f"stackexchange[math.stackexchange.com]:{DUMP}")


@pytest.mark.parametrize(
    ("date", "licence"),
    [
        ("2011-04-07T23:59:59.999", "CC-BY-SA-2.5"),
        ("2011-04-08T00:00:00.000", "CC-BY-SA-3.0"),
        ("2018-05-01T23:59:59.000", "CC-BY-SA-3.0"),
        ("2018-05-02T00:00:00.000", "CC-BY-SA-4.0"),
    ],
)
def test_licence_by_post_date(date, licence):
    assert licence_for(date) == licence


def test_html_keeps_code_verbatim():
    html = "<p>x</p><pre><code>a  &lt;b&gt;\n  c</code></pre><p>use <code>f()</code></p>"
    assert html_to_text(html) == "x\n\n```\na  <b>\n  c\n```\n\nuse `f()`"


def test_not_a_posts_file(tmp_path):
    bad = tmp_path / "Posts.xml"
    bad.write_text("<users><row Id='1'/></users>")
    with pytest.raises(DataError, match=r"not a StackExchange Posts.xml \(root element <users>"):
        list(open_source(f"stackexchange:{bad}"))
