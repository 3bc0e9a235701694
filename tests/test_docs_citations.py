"""What docs/ARCHITECTURE.md and docs/model_api.md cite exists: file and folder paths, `ats_*`
modules and the names in them, classes and their members, the architecture tests named, and (on
ARCHITECTURE.md) config keys. Read from the sources (AST, nothing imported but the config's keys),
so a rename that leaves a page behind fails here."""

import ast
import builtins
import re
import typing
from pathlib import Path

import pytest
from ats_train.config import valid_keys

ROOT = Path(__file__).resolve().parents[1]
SRC_DIRS = [*sorted(ROOT.glob("packages/*/src")), ROOT / "native/python"]
# page -> the fewest citations it has (fewer: the parser no longer finds them)
PAGES = {"docs/ARCHITECTURE.md": 200, "docs/model_api.md": 15}
# the first part of a checked path: a folder or file at the repository root, or an ats_* package
ROOTS = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"}
CONFIG_SECTIONS = {"model", "data", "train", "loss", "optim", "checkpoint", "parallel"}
CONFIG_SECTIONS |= {"orchestrator", "faults", "plan", "profile"}
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)\)")
# paths written inside fenced blocks (diagrams): ats_train/build.py, native/src/...
FENCED_PATH = re.compile(
    r"(?<![\w/])((?:ats_\w+|packages|native|docs|tests|benchmarks|envs)/[\w./*-]*)"
)


def resolve_path(text: str) -> bool:
    """`text` names a file or folder at the root or under a package's src/ (globs must match)."""
    bases = [ROOT, *SRC_DIRS]
    if "*" in text:
        return any(any(base.glob(text.rstrip("/"))) for base in bases)
    return any((base / text).exists() for base in bases)


def is_path(text: str) -> bool:
    if not re.fullmatch(r"[\w./*-]+", text):
        return False
    if "/" in text:  # a run's paths (run_dir/checkpoints/...) are not the repository's
        source = text.endswith((".py", ".pyi", ".md", ".cpp", ".h", ".toml"))
        return source or text.split("/")[0] in ROOTS or text.startswith("ats_")
    return text.endswith((".md", ".py")) and text.split(".")[0].isupper()  # README.md, ...


def _definitions() -> tuple[dict[str, set[str]], set[str], dict[str, set[str]]]:
    """(class name -> its members, every top-level name, module name -> its top-level names) of the
    packages' sources and tests/test_architecture.py."""
    classes: dict[str, set[str]] = {}
    top: set[str] = set()
    modules: dict[str, set[str]] = {}
    files = [(p, src) for src in SRC_DIRS for p in src.rglob("*.py")]
    files.append((ROOT / "tests/test_architecture.py", None))
    for path, src in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            if isinstance(node, ast.ClassDef):
                members = classes.setdefault(node.name, set())
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        members.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        members.update(t.id for t in item.targets if isinstance(t, ast.Name))
        top |= names
        if src is not None:
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = names
    return classes, top, modules


CLASSES, TOP_NAMES, MODULES = _definitions()


def resolve_module_name(text: str) -> bool:
    """`ats_x.y.z`: the longest prefix that is a module, and the rest a name defined in it (a class
    member for a third part)."""
    parts = text.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module in MODULES:
            rest = parts[i:]
            if not rest:
                return True
            if rest[0] not in MODULES[module]:
                return False
            return len(rest) == 1 or (len(rest) == 2 and rest[1] in CLASSES.get(rest[0], set()))
    return False


def resolve_identifier(text: str) -> bool | None:
    """`Name` or `Name.member` (Name capitalized), and `test_*`: defined in the sources; None when
    `text` is not such a name."""
    if re.fullmatch(r"test_\w+", text):
        return text in TOP_NAMES
    # CamelCase or CONSTANT_CASE, not a symbol of the math (P_e, E)
    match = re.fullmatch(r"([A-Z][A-Za-z0-9]+|[A-Z][A-Z0-9_]+)(?:\.(\w+))?", text)
    if match is None:
        return None
    name, member = match.groups()
    if hasattr(typing, name) or hasattr(builtins, name):
        return member is None
    if member is None:
        return name in TOP_NAMES or name in CLASSES
    return member in CLASSES.get(name, set())


def resolve_config_key(text: str, keys: set[str]) -> bool | None:
    """`section.key` (or `section.table.*`): a key the config accepts; None when not a key."""
    if not re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)*(\.\*)?", text):
        return None
    if text.split(".")[0] not in CONFIG_SECTIONS or "." not in text:
        return None
    if text.endswith((".json", ".safetensors", ".toml")):  # a file name, model.safetensors
        return None
    if text.endswith(".*"):
        return any(k.startswith(text[:-1]) for k in keys)
    return text in keys


def citations(page: str) -> list[tuple[str, str]]:
    """(kind, text) of everything `page` cites: inline code spans, link targets, fenced paths."""
    text = (ROOT / page).read_text(encoding="utf-8")
    found = [("path", m) for block in FENCE.findall(text) for m in FENCED_PATH.findall(block)]
    prose = FENCE.sub("", text)
    found += [("link", m) for m in LINK.findall(prose) if "://" not in m]
    found += [("span", m.strip()) for m in SPAN.findall(prose)]
    return found


def problems_of(page: str) -> tuple[list[str], int]:
    """(what does not resolve, how many citations were checked)."""
    keys = set(valid_keys()) if page.endswith("ARCHITECTURE.md") else set()
    problems, checked = [], 0
    for kind, text in citations(page):
        if kind == "link":
            ok: bool | None = (ROOT / page).parent.joinpath(text).exists()
        elif kind == "path" or is_path(text):
            ok = resolve_path(text)
        elif text.startswith("ats_") and re.fullmatch(r"ats_\w+(\.\w+)*", text):
            ok = resolve_module_name(text)
        elif (ok := resolve_identifier(text)) is None and keys:
            ok = resolve_config_key(text, keys)
        if ok is None:
            continue
        checked += 1
        if not ok:
            problems.append(f"{page}: `{text}` ({kind}) does not exist")
    return problems, checked


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_citation_of_the_page_exists(page: str) -> None:
    problems, checked = problems_of(page)
    assert checked >= PAGES[page], f"{page}: {checked} citations found: is the parser still right?"
    assert not problems, "\n".join(problems)


def test_the_checks_refuse_what_does_not_exist() -> None:
    keys = set(valid_keys())
    assert resolve_path("ats_train/backends/fsdp2.py") and resolve_path("native/src/runtime/")
    assert not resolve_path("ats_train/backends/fsdp3.py")
    assert resolve_path("packages/*/tests/") and not resolve_path("packages/*/nothing/")
    assert resolve_module_name("ats_kernels.select")  # re-exported by the package
    assert resolve_module_name("ats_train.backends.deepspeed.external_parameters")
    assert not resolve_module_name("ats_train.backends.deepspeed.internal_parameters")
    assert not resolve_module_name("ats_train.parallelize")
    assert resolve_identifier("Trainer.forward_backward") is True
    assert resolve_identifier("Trainer.backward_forward") is False
    assert resolve_identifier("test_no_source_file_is_over_the_line_budget") is True
    assert resolve_identifier("NoSuchClass") is False and resolve_identifier("torchrun") is None
    assert resolve_identifier("KINDS") is True and resolve_identifier("P_e") is None
    assert resolve_config_key("parallel.deepspeed.zero_stage", keys) is True
    assert resolve_config_key("parallel.zero_stage", keys) is False  # renamed
    assert resolve_config_key("parallel.fsdp2.*", keys) is True
    assert resolve_config_key("parallel.fsdp3.*", keys) is False
