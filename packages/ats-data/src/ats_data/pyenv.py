"""The `pyenv` source: every *.py, *.md and *.rst file of the running interpreter's standard library
and site-packages, a code-and-docs corpus of hundreds of MB that is on every machine with Python
and needs no network (issue #30: large enough that a model trained for minutes does not memorise
it). The file list is sorted by (root, relative path), so it is deterministic given the
environment; each file is one document, so prepare's content-digest split holds out whole files.
"""

import os
import sysconfig
from pathlib import Path

PYENV_SPEC = "pyenv"
PYENV_SUFFIXES = {".py": "python", ".md": "text", ".rst": "text"}
# Under the stdlib these hold another environment's packages, listed (if at all) as their own root.
_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages"})


def pyenv_roots() -> tuple[Path, list[Path]]:
    """(stdlib folder, the site-packages folders) of the running interpreter (a venv's own)."""
    paths = sysconfig.get_paths()
    stdlib = Path(paths["stdlib"]).resolve()
    sites = sorted({Path(paths[k]).resolve() for k in ("purelib", "platlib") if paths.get(k)})
    return stdlib, [p for p in sites if p.is_dir()]


def pyenv_files(stdlib: Path, sites: list[Path]) -> list[tuple[Path, str]]:
    """(path, source kind) of every *.py / *.md / *.rst file below the roots, stdlib first, then
    each site folder, each sorted by relative POSIX path. Symlinked folders are not followed (a
    loop or a link out of the environment would make the list depend on more than it)."""
    found: list[tuple[Path, str]] = []
    for root, skip in [(stdlib, _STDLIB_SKIP_DIRS), *((s, frozenset()) for s in sites)]:
        below: list[tuple[str, Path, str]] = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in skip and d != "__pycache__"]
            for name in names:
                kind = PYENV_SUFFIXES.get(os.path.splitext(name)[1].lower())
                path = Path(folder, name)
                if kind is not None and path.is_file():
                    below.append((path.relative_to(root).as_posix(), path, kind))
        below.sort(key=lambda entry: entry[0])
        found.extend((path, kind) for _, path, kind in below)
    return found
