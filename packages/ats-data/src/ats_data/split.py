"""Deterministic train/val split by document: a document goes to "val" when the first 8 bytes
of its content digest, read as a fraction of 2**64, fall below val_fraction. The split depends
only on the document's content, never on its position or on the other documents."""

from ats_data.errors import DataError

SPLITS = ("train", "val")


def check_val_fraction(val_fraction: float) -> None:
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")


def assign_split(digest: bytes, val_fraction: float) -> str:
    """'train' or 'val' for a document with this content digest (at least 8 bytes)."""
    if len(digest) < 8:
        raise DataError(f"digest must have at least 8 bytes, got {len(digest)}")
    return "val" if int.from_bytes(digest[:8], "big") < val_fraction * 2.0**64 else "train"
