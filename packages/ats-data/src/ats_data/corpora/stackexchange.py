"""StackExchange data dump `Posts.xml` (one `<row .../>` per post): each question joined with its
answers, highest score first (ties: older first), HTML bodies made text with code blocks kept
(fenced) and inline code in backticks. Licence by post date, as Stack Exchange states it:
CC BY-SA 2.5 before 2011-04-08, 3.0 before 2018-05-02, 4.0 from then on; a document holding posts
of several periods lists each licence.

Answers can come long after their question in the file, so the join goes through an SQLite file
in a temporary folder beside nothing the user owns: memory stays flat whatever the dump size.
`stackexchange:DUMP` takes a Posts.xml, a site folder holding one, or a dump folder of site
folders; `stackexchange[cooking.stackexchange.com,...]:DUMP` keeps the listed sites.
"""

import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from html.parser import HTMLParser
from pathlib import Path

from ats_data.corpora.dumpfile import iter_xml, local_name, open_dump
from ats_data.document import Document
from ats_data.errors import DataError

_LICENCE_PERIODS = (("2011-04-08", "CC-BY-SA-2.5"), ("2018-05-02", "CC-BY-SA-3.0"))
_LATEST_LICENCE = "CC-BY-SA-4.0"
_BLOCK_TAGS = frozenset(
    {
        "p",
        "div",
        "blockquote",
        "ul",
        "ol",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "hr",
        "table",
        "tr",
    }
)


def licence_for(creation_date: str) -> str:
    """The licence of a post created at this ISO date-time (UTC)."""
    for before, licence in _LICENCE_PERIODS:
        if creation_date[:10] < before:
            return licence
    return _LATEST_LICENCE


class _HTMLToText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._pre = 0
        self._code = 0

    def handle_starttag(self, tag, attrs):
        if tag == "pre":
            self._pre += 1
            self.parts.append("\n```\n")
        elif tag == "code":
            self._code += 1
            if not self._pre:
                self.parts.append("`")
        elif tag == "br":
            self.parts.append("\n")
        elif tag == "li":
            self.parts.append("\n- ")
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag == "pre":
            self._pre = max(self._pre - 1, 0)
            if self.parts and not self.parts[-1].endswith("\n"):
                self.parts.append("\n")
            self.parts.append("```\n")
        elif tag == "code":
            self._code = max(self._code - 1, 0)
            if not self._pre:
                self.parts.append("`")
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _HTMLToText()
    parser.feed(html)
    parser.close()
    text = "".join(parser.parts)
    lines = [line.rstrip() for line in text.split("\n")]
    out: list[str] = []
    for line in lines:  # at most one blank line in a row
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


def posts_files(path: Path, sites: Sequence[str] = ()) -> list[Path]:
    """The Posts.xml files of a file, a site folder or a folder of site folders, by site."""
    if path.is_file():
        found = [path]
    elif (path / "Posts.xml").is_file():
        found = [path / "Posts.xml"]
    elif path.is_dir():
        found = sorted(p / "Posts.xml" for p in path.iterdir() if (p / "Posts.xml").is_file())
    else:
        raise DataError(f"stackexchange source not found: {path}")
    if sites:
        found = [p for p in found if site_of(p) in sites]
        missing = set(sites) - {site_of(p) for p in found}
        if missing:
            raise DataError(f"{path}: no Posts.xml for site(s) {', '.join(sorted(missing))}")
    if not found:
        raise DataError(f"{path}: no Posts.xml in it or in its subfolders")
    return found


def site_of(posts: Path) -> str:
    """The site's host name, from the folder holding Posts.xml (the dump's archive name)."""
    return posts.parent.name


def _load(path: Path, db: sqlite3.Connection, counts: Counter) -> None:
    db.execute(
        "CREATE TABLE q (id INTEGER PRIMARY KEY, title TEXT, body TEXT, date TEXT, tags TEXT)"
    )
    db.execute("CREATE TABLE a (parent INTEGER, id INTEGER, score INTEGER, body TEXT, date TEXT)")
    root = None
    with open_dump(path) as f:
        for event, elem in iter_xml(path, f):
            if root is None:
                root = elem
                if local_name(elem.tag) != "posts":
                    raise DataError(
                        f"{path}: not a StackExchange Posts.xml (root element "
                        f"<{local_name(elem.tag)}>, expected <posts>)"
                    )
            if event != "end" or elem.tag != "row":
                continue
            a = elem.attrib
            kind = a.get("PostTypeId")
            try:
                if kind == "1":
                    db.execute(
                        "INSERT INTO q VALUES (?, ?, ?, ?, ?)",
                        (
                            int(a["Id"]),
                            a.get("Title", ""),
                            a.get("Body", ""),
                            a.get("CreationDate", ""),
                            a.get("Tags", ""),
                        ),
                    )
                elif kind == "2":
                    db.execute(
                        "INSERT INTO a VALUES (?, ?, ?, ?, ?)",
                        (
                            int(a["ParentId"]),
                            int(a["Id"]),
                            int(a.get("Score", "0")),
                            a.get("Body", ""),
                            a.get("CreationDate", ""),
                        ),
                    )
                else:
                    counts["stackexchange_other_post_type"] += 1
            except (KeyError, ValueError) as e:
                raise DataError(
                    f"{path}: row Id={a.get('Id')!r}: missing or non-integer attribute {e}"
                ) from None
            root.clear()
    db.execute("CREATE INDEX a_parent ON a (parent, score DESC, id)")
    db.commit()


def read(path: Path, counts: Counter) -> Iterator[Document]:
    """Question + answers documents of one Posts.xml."""
    site = site_of(path)
    with tempfile.TemporaryDirectory(prefix="ats-data-se-") as tmp:
        db = sqlite3.connect(Path(tmp) / "posts.sqlite")
        try:
            _load(path, db, counts)
            questions = db.execute("SELECT id, title, body, date, tags FROM q ORDER BY id")
            answers_db = sqlite3.connect(Path(tmp) / "posts.sqlite")
            for qid, title, body, date, tags in questions:
                answers = answers_db.execute(
                    "SELECT body, date FROM a WHERE parent = ? ORDER BY score DESC, id", (qid,)
                ).fetchall()
                if not answers:
                    counts["stackexchange_unanswered"] += 1
                parts = [title, html_to_text(body)] + [html_to_text(b) for b, _ in answers]
                licences = sorted({licence_for(date)} | {licence_for(d) for _, d in answers})
                yield Document(
                    text="\n\n".join(p for p in parts if p),
                    source="stackexchange",
                    id=f"{site}/{qid}",
                    title=title,
                    url=f"https://{site}/questions/{qid}" if "." in site else "",
                    licence=", ".join(licences),
                    meta={
                        "tags": tags.strip("<>|").replace("><", " ").replace("|", " ").split(),
                        "answers": len(answers),
                    },
                )
            answers_db.close()
        finally:
            db.close()
