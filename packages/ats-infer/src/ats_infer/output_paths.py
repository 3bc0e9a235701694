"""Writing a command's output without losing data:

- an existing output that is not empty is refused unless `force`;
- an input is never replaced, even with `force`: not the same file or directory (resolved paths,
  os.path.samefile, so symlinks and hard links count), not a directory holding an input;
- the output is built under a temporary name beside it and renamed into place only when complete,
  so a failure or Ctrl-C leaves the old output (or nothing) and no half-written file.
"""

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ats_infer.tensor_files import path_kind


def _is_empty(path: Path, kind: str) -> bool:
    if kind == "file":
        return path.stat().st_size == 0
    return not any(path.iterdir())


def _inside(inner: Path, outer: Path) -> bool:
    return inner.resolve().is_relative_to(outer.resolve())


def check_output(out: Path, inputs: Iterable[Path], kind: str, force: bool) -> None:
    """Raise unless `out` may become a new `kind` ("file" or "directory") output."""
    existing = path_kind(out)
    absent = existing in ("missing", "dangling symlink")
    if not absent and existing not in ("file", "directory"):
        raise ValueError(f"output {out} is a {existing}; expected a {kind} or nothing")
    for source in inputs:
        if out.resolve() == source.resolve() or (not absent and os.path.samefile(out, source)):
            raise ValueError(f"output {out} is the input {source}; choose another path")
        if existing == "directory" and _inside(source, out):
            raise ValueError(f"output {out} holds the input {source}; choose another path")
    if absent:
        return
    if existing != kind:
        raise ValueError(f"output {out} exists and is a {existing}; expected a {kind} or nothing")
    if not force and not _is_empty(out, kind):
        raise FileExistsError(
            f"output {out} exists and is not empty; choose a new path or pass --force to replace it"
        )


def _default_mode(directory: bool) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


@contextmanager
def new_file(out: str | Path, inputs: Iterable[Path], force: bool = False) -> Iterator[Path]:
    """Yields a temporary path beside `out` to write; on success it replaces `out` atomically."""
    out = Path(out)
    check_output(out, inputs, "file", force)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, _default_mode(directory=False))
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def new_directory(out: str | Path, inputs: Iterable[Path], force: bool = False) -> Iterator[Path]:
    """Yields a temporary directory beside `out` to fill; on success it takes `out`'s place (a
    previous `out` is moved aside first and removed only once the new one is in place)."""
    out = Path(out)
    check_output(out, inputs, "directory", force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, _default_mode(directory=True))
        if path_kind(out) == "missing":
            os.rename(tmp, out)
            return
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
        os.rename(out, old / out.name)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old / out.name, out)
            old.rmdir()
            raise
        shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
