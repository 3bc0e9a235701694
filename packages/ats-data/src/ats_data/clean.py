"""Document cleaning: control characters removed (except newline and tab), Unicode NFC, then
(optional) PII scrubbing (pii.py), the length filter and (optional) Gopher's repetition filters
(repetition.py). `Cleaner` counts what it drops and replaces so prepare and extract can report
it."""

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

from ats_data.errors import DataError
from ats_data.pii import scrub_pii
from ats_data.repetition import RepetitionConfig, repetition_reason

# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F; keep \t (09) and \n (0A).
# \r goes too, so CRLF line ends become LF.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_text(text: str) -> str:
    """Remove control characters, then normalize to NFC. Removal comes first: dropping a control
    character can bring a base letter next to a combining mark, which NFC must then compose."""
    return unicodedata.normalize("NFC", _CONTROL.sub("", text))


@dataclass(frozen=True)
class CleanConfig:
    min_chars: int = 1
    max_chars: int | None = None
    repetition: bool = False  # Gopher's repetition filters at the paper's thresholds
    pii: bool = False  # replace e-mails, public IPs and phone numbers by placeholders

    def __post_init__(self) -> None:
        if self.min_chars < 0:
            raise DataError(f"min_chars must be >= 0, got {self.min_chars}")
        if self.max_chars is not None and self.max_chars < max(self.min_chars, 1):
            raise DataError(
                f"max_chars must be >= max(min_chars, 1) = {max(self.min_chars, 1)}, "
                f"got {self.max_chars}"
            )


class Cleaner:
    """Cleans one document at a time; returns None for a document outside the length bounds
    (measured in characters after cleaning)."""

    def __init__(self, config: CleanConfig) -> None:
        self.config = config
        self.repetition = RepetitionConfig() if config.repetition else None
        self.dropped_short = 0
        self.dropped_long = 0
        self.dropped_repetition: Counter = Counter()  # by the first test failed
        self.pii_replaced: Counter = Counter()  # by kind: email, ip, phone

    def __call__(self, text: str) -> str | None:
        text = clean_text(text)
        if self.config.pii:
            text = scrub_pii(text, self.pii_replaced)
        if len(text) < self.config.min_chars:
            self.dropped_short += 1
            return None
        if self.config.max_chars is not None and len(text) > self.config.max_chars:
            self.dropped_long += 1
            return None
        if self.repetition is not None:
            reason = repetition_reason(text, self.repetition)
            if reason is not None:
                self.dropped_repetition[reason] += 1
                return None
        return text
