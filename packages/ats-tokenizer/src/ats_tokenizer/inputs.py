"""User input made into one-line errors: paths that must be regular files, UTF-8 text, and JSON
(syntax errors with their line and column, nesting too deep for Python's parser). ats-data reads
its JSON and input files through these too, with its own error type."""

import json
import stat
import sys
from os import PathLike
from pathlib import Path
from typing import Any


def check_input_file(path: str | PathLike[str], what: str) -> Path:
    """`path` as a Path if it is a regular file (after symlinks); else FileNotFoundError (missing
    or a dangling symlink), IsADirectoryError, or OSError saying what is there instead. A device
    such as /dev/zero is refused: reading it never ends."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        dangling = " (a symlink to nothing)" if path.is_symlink() else ""
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist{dangling}") from None
    except OSError as err:  # a symlink loop, a component that is a file, no permission
        raise OSError(f"{what} {str(path)!r} cannot be opened: {err.strerror}") from None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{what} {str(path)!r} is a folder, expected a file")
    if not stat.S_ISREG(mode):
        raise OSError(f"{what} {str(path)!r} is not a regular file (a device, pipe or socket)")
    return path


def decode_utf8(data: bytes, where: str, error: type[ValueError] = ValueError) -> str:
    """`data` as UTF-8 text (a leading BOM is kept); `error` names the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(
            f"{where}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})"
        ) from None


def parse_json(
    text: str, where: str, error: type[ValueError] = ValueError, *, line: int = 1
) -> Any:
    """json.loads(text); a syntax error or nesting too deep raises `error` naming `where` and
    the position. `line` is the line number of text's first line in its file (JSONL)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        # json's messages end in " at" or " starting at" when a position follows
        reason = err.msg.removesuffix(" at").removesuffix(" starting")
        raise error(
            f"{where}: not valid JSON at line {line + err.lineno - 1} column {err.colno}: {reason}"
        ) from None
    except RecursionError:
        # The C parser recurses once per nested array/object and stops at the recursion limit.
        raise error(
            f"{where}: not valid JSON for this reader: arrays/objects nested more than about "
            f"{sys.getrecursionlimit()} levels deep"
        ) from None


def read_json_file(
    path: str | PathLike[str], what: str, error: type[ValueError] = ValueError
) -> Any:
    """The JSON document in a UTF-8 file; every failure is one line naming the file."""
    path = check_input_file(path, what)
    where = str(path)
    return parse_json(decode_utf8(path.read_bytes(), where, error), where, error)
