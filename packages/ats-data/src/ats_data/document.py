"""A document with its provenance: the text and the metadata every reader fills in (id, title,
url, licence, source), plus reader-specific extras in `meta`. `ats-data extract` writes one per
JSONL line; prepare counts licences and sources into index.json."""

from dataclasses import dataclass, field


@dataclass
class Document:
    text: str
    source: str  # the reader: "text", "jsonl", ..., "wikipedia", "arxiv", "pubmed", ...
    id: str = ""
    title: str = ""
    url: str = ""
    licence: str = ""
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        record = {
            "text": self.text,
            "id": self.id,
            "title": self.title,
            "url": self.url,
            "licence": self.licence,
            "source": self.source,
        }
        if self.meta:
            record["meta"] = self.meta
        return record
