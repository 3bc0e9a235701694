"""Architecture rules of ../shared/ARCHITECTURE.md section 2, checked on the source: the dependency
direction between packages is never reversed, ats-model stays single-device math, ats-infer
installs without the training side."""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What each package may import among ATS packages (the arrows of ARCHITECTURE.md, transitively).
ALLOWED = {
    "ats_native": set(),
    "ats_tokenizer": {"ats_native"},
    "ats_kernels": set(),
    "ats_model": {"ats_kernels"},
    "ats_data": {"ats_tokenizer", "ats_native"},
    "ats_train": {"ats_model", "ats_kernels", "ats_data", "ats_tokenizer", "ats_native"},
    "ats_infer": {"ats_model", "ats_kernels", "ats_tokenizer", "ats_native"},
}
# Outside modules a package must never import.
FORBIDDEN = {
    "ats_model": {"torch.distributed", "deepspeed", "colossalai"},
    "ats_infer": {"deepspeed", "colossalai"},
    "ats_tokenizer": {"torch"},
    "ats_native": {"torch"},
    "ats_kernels": {"torch.distributed"},
}


def package_sources() -> dict[str, list[Path]]:
    sources = {name: [] for name in ALLOWED}
    for path in ROOT.glob("packages/*/src/ats_*/**/*.py"):
        sources[path.relative_to(ROOT).parts[3]].append(path)
    sources["ats_native"] = sorted(ROOT.glob("native/python/ats_native/**/*.py"))
    return sources


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def violations(package: str, modules: set[str]) -> list[str]:
    found = []
    for module in sorted(modules):
        top = module.split(".")[0]
        if top.startswith("ats_") and top != package and top not in ALLOWED[package]:
            found.append(f"{module} (an ATS package above {package} in the dependency direction)")
        for banned in FORBIDDEN.get(package, ()):
            if module == banned or module.startswith(banned + "."):
                found.append(f"{module} (forbidden in {package})")
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_the_dependency_direction(package: str) -> None:
    problems = []
    for path in package_sources()[package]:
        for problem in violations(package, imported_modules(path)):
            problems.append(f"{path.relative_to(ROOT)}: imports {problem}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("package", "module", "expected"),
    [
        ("ats_model", "torch.distributed", True),
        ("ats_model", "torch.distributed.fsdp", True),
        ("ats_model", "torch.nn", False),
        ("ats_infer", "ats_train.trainer", True),
        ("ats_infer", "ats_data", True),
        ("ats_infer", "deepspeed", True),
        ("ats_infer", "colossalai.booster", True),
        ("ats_infer", "ats_model", False),
        ("ats_tokenizer", "ats_model", True),
        ("ats_tokenizer", "torch", True),
        ("ats_tokenizer", "ats_native", False),
        ("ats_kernels", "ats_model", True),
        ("ats_data", "ats_train", True),
    ],
)
def test_the_rules_catch_a_reversed_import(package: str, module: str, expected: bool) -> None:
    assert bool(violations(package, {module})) is expected


def test_declared_dependencies_follow_the_dependency_direction() -> None:
    # The import rules above are only as good as what pip would install: check pyproject too.
    for pyproject in [*ROOT.glob("packages/*/pyproject.toml"), ROOT / "native/pyproject.toml"]:
        project = tomllib.loads(pyproject.read_text())["project"]
        package = project["name"].replace("-", "_")
        declared = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            declared.extend(extra)
        for requirement in declared:
            name = requirement.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip()
            module = name.replace("-", "_")
            if module.startswith("ats_"):
                assert module in ALLOWED[package], f"{pyproject}: {package} depends on {name}"
                assert ">=" in requirement, f"{pyproject}: {name} needs a version bound"
        assert package in ALLOWED, f"{pyproject}: unknown package {package}"


# The native serving path: `ats-infer serve` installs and runs without torch (issue 23). Every
# module of ats_infer.serve, and the ats_infer modules it loads on the native path, import neither
# torch nor ats-model (which needs torch), not even inside a function.
SERVE_NATIVE_PATH = ["serve/**/*.py", "engine.py", "native_engine.py", "quantize.py",
                     "tensor_files.py", "text_stream.py", "cli.py"]  # fmt: skip


def test_native_serve_path_imports_no_torch() -> None:
    src = ROOT / "packages/ats-infer/src/ats_infer"
    problems = []
    for pattern in SERVE_NATIVE_PATH:
        for path in sorted(src.glob(pattern)):
            for module in imported_modules(path):
                if module.split(".")[0] in ("torch", "ats_model"):
                    problems.append(f"{path.relative_to(ROOT)}: imports {module}")
    assert not problems, "\n".join(problems)
