"""Architecture rules of docs/ARCHITECTURE.md section 2, checked on the source: the dependency
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
    "ats_infer": {"ats_model", "ats_kernels", "ats_data", "ats_tokenizer", "ats_native"},
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
        ("ats_infer", "ats_data", False),  # the [eval] extra: function-local, see below
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


def requirement_module(requirement: str) -> str:
    name = requirement.split("[")[0].split(">")[0].split("<")[0].split("=")[0].split(";")[0]
    return name.strip().replace("-", "_")


def test_declared_dependencies_follow_the_dependency_direction() -> None:
    # The import rules above are only as good as what pip would install: check pyproject too.
    for pyproject in [*ROOT.glob("packages/*/pyproject.toml"), ROOT / "native/pyproject.toml"]:
        project = tomllib.loads(pyproject.read_text())["project"]
        package = project["name"].replace("-", "_")
        declared = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            declared.extend(extra)
        for requirement in declared:
            module = requirement_module(requirement)
            if module.startswith("ats_"):
                assert module in ALLOWED[package], f"{pyproject}: {package} depends on {module}"
                assert ">=" in requirement, f"{pyproject}: {module} needs a version bound"
        assert package in ALLOWED, f"{pyproject}: unknown package {package}"


# What each package's base `dependencies` may name among ATS packages; the rest come only through
# an extra. `pip install ats-infer` gets the tokenizer and nothing of the data or training side.
BASE_DEPENDENCIES = {"ats_infer": {"ats_tokenizer"}}


def test_ats_infer_base_dependencies_hold_no_data_or_training_package() -> None:
    for package, allowed in BASE_DEPENDENCIES.items():
        pyproject = ROOT / "packages" / package.replace("_", "-") / "pyproject.toml"
        declared = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        ats = {requirement_module(r) for r in declared} & set(ALLOWED)
        assert ats <= allowed, f"{pyproject}: base dependencies name {sorted(ats - allowed)}"


def module_level_imports(path: Path) -> set[str]:
    """Modules `path` imports when it is imported: everything outside function bodies."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.add(child.module)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return found


# ats-infer's one door to ats-data ([eval]): corpus.split_documents imports it when called, so
# every other command runs where ats-data is not installed.
ATS_DATA_DOOR = "packages/ats-infer/src/ats_infer/corpus.py"


def test_ats_infer_imports_ats_data_only_inside_its_one_function(tmp_path: Path) -> None:
    problems = []
    for path in package_sources()["ats_infer"]:
        rel = path.relative_to(ROOT).as_posix()
        for module in sorted(imported_modules(path)):
            if module.split(".")[0] != "ats_data":
                continue
            if rel != ATS_DATA_DOOR:
                problems.append(f"{rel}: imports {module} (only {ATS_DATA_DOOR} may)")
            elif module in module_level_imports(path):
                problems.append(f"{rel}: imports {module} at module level")
    assert not problems, "\n".join(problems)
    sample = tmp_path / "sample.py"
    sample.write_text("import ats_data\ndef f():\n    from ats_data.split import SPLITS\n")
    assert module_level_imports(sample) == {"ats_data"}


def _sources(pattern: str) -> list[Path]:
    return sorted(ROOT.glob(pattern))


# ats_model's names for what only a training backend needs (ZeRO-3's hooks and gathers)
TRAINING_NAMES = {
    "external_parameters",
    "register_external_parameter",
    "GatheredParameters",
    "gathered",
    "deepspeed",
    "zero3",
}


def training_names(path: Path) -> set[str]:
    """Identifiers in `path` (names, attributes, functions, arguments) from TRAINING_NAMES."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        name = None
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.arg):
            name = node.arg
        if name is not None and name.lower() in TRAINING_NAMES:
            found.add(name)
    return found


def test_ats_model_holds_no_training_backend_hooks() -> None:
    """What ZeRO-3 needs (external parameters, gathered init) is the DeepSpeed backend's."""
    problems = [
        f"{path.relative_to(ROOT)}: {sorted(names)}"
        for path in package_sources()["ats_model"]
        if (names := training_names(path))
    ]
    assert not problems, "\n".join(problems)


MODEL_NAMES = {"model", "raw_model"}


def model_attribute_writes(path: Path) -> list[str]:
    """`model.x = ...` / `self.raw_model.x += ...` / setattr(model, ...) in `path`: a model object's
    attribute set from outside the model package (what it computes is set through its methods)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []

    def is_model(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id in MODEL_NAMES) or (
            isinstance(node, ast.Attribute) and node.attr in MODEL_NAMES
        )

    def flat(target: ast.expr) -> list[ast.expr]:
        if isinstance(target, (ast.Tuple, ast.List)):
            return [t for element in target.elts for t in flat(element)]
        return [target.value] if isinstance(target, ast.Starred) else [target]

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in flat(target)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and is_model(target.value):
                found.append(f"line {target.lineno}: .{target.attr} =")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and is_model(node.args[0])
        ):
            found.append(f"line {node.lineno}: setattr")
    return sorted(found, key=lambda line: int(line.split()[1].rstrip(":")))


def test_ats_train_sets_no_attribute_on_a_model() -> None:
    problems = [
        f"{path.relative_to(ROOT)} {write}"
        for path in package_sources()["ats_train"]
        for write in model_attribute_writes(path)
    ]
    assert not problems, "\n".join(problems)


def test_the_attribute_rule_catches_a_write(tmp_path: Path) -> None:
    source = tmp_path / "poke.py"
    source.write_text(
        "model.fused_loss = True\n"
        "trainer.raw_model.x += 1\n"
        "setattr(model, 'y', 2)\n"
        "x, model.z = 1, 2\n"
        "a.model = build()\n"
        "model = build()\n"
        "layer.capacity = 0.5\n"
    )
    assert model_attribute_writes(source) == [
        "line 1: .fused_loss =",
        "line 2: .x =",
        "line 3: setattr",
        "line 4: .z =",
    ]


def test_native_fuzz_tools_do_not_import_the_model_package() -> None:
    """The native runtime sits below ats_model: its fuzz seeds are built from plain files."""
    sources = _sources("native/fuzz/*.py")
    assert sources
    problems = [
        f"{path.relative_to(ROOT)}: imports {module}"
        for path in sources
        for module in imported_modules(path)
        if module.split(".")[0] in {"ats_model", "ats_train", "ats_infer", "torch"}
    ]
    assert not problems, "\n".join(problems)


def test_the_orchestrator_does_not_import_the_trainer() -> None:
    """The orchestrator sees a run through orchestrator/handle.py's RunHandle, never the Trainer."""
    sources = _sources("packages/ats-train/src/ats_train/orchestrator/**/*.py")
    assert sources
    problems = [
        f"{path.relative_to(ROOT)}: imports {module}"
        for path in sources
        for module in imported_modules(path)
        if module == "ats_train.trainer" or module.startswith("ats_train.trainer.")
    ]
    assert not problems, "\n".join(problems)


def orchestrator_writes(path: Path) -> list[str]:
    """Attribute writes and setattr calls in `path` on anything but the orchestrator's own state
    (self, orch, the evidence records it judges): a kind changes the run only through
    RunHandle.apply."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute):
                base = target.value
                while isinstance(base, (ast.Attribute, ast.Subscript)):
                    base = base.value
                if not (isinstance(base, ast.Name) and base.id in {"self", "orch", "evidence"}):
                    found.append(f"line {target.lineno}: .{target.attr} =")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "setattr":
                found.append(f"line {node.lineno}: setattr")
    return found


def test_the_orchestrator_changes_a_run_only_by_records(tmp_path: Path) -> None:
    sources = _sources("packages/ats-train/src/ats_train/orchestrator/**/*.py")
    problems = [f"{p.relative_to(ROOT)} {w}" for p in sources for w in orchestrator_writes(p)]
    assert not problems, "\n".join(problems)
    control = tmp_path / "kind.py"
    control.write_text(
        "orch.lr_scale = 0.5\nself.window = []\nrun.model.layers[0].capacity = 0.5\n"
        "trainer.config.optim.grad_clip = 1.0\nsetattr(layer, 'temperature', 2.0)\n"
    )
    assert orchestrator_writes(control) == [
        "line 3: .capacity =",
        "line 4: .grad_clip =",
        "line 5: setattr",
    ]


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


# ---- inside ats-train: the module import graph, drawn from the sources ----------------------------
TRAIN_SRC = ROOT / "packages/ats-train/src"


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def module_imports(name: str, path: Path, *, type_checking: bool) -> set[str]:
    """Every module the file `path` (module `name`) imports, at any depth (function-local included):
    `from a.b import c` names both a.b and a.b.c; relative imports are resolved. With
    type_checking=False, imports under `if TYPE_CHECKING:` are left out (they never run)."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                if type_checking:
                    for inner in child.body:
                        visit_node(inner)
                for inner in child.orelse:
                    visit_node(inner)
                continue
            visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def import_graph(src: Path, *, type_checking: bool) -> dict[str, set[str]]:
    """Module -> the modules of the same source tree it imports."""
    paths = {_module_name(p, src): p for p in src.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        imported = module_imports(name, path, type_checking=type_checking)
        graph[name] = {m for m in imported if m in paths and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle [a, b, ..., a], or None when the graph has none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_ats_train_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph(TRAIN_SRC, type_checking=False))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    cycle = find_cycle(import_graph(TRAIN_SRC, type_checking=True))
    assert cycle is None, "import cycle through TYPE_CHECKING imports: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    import pkg.a\n")  # fmt: skip
    assert find_cycle(import_graph(tmp_path, type_checking=False)) is None
    assert find_cycle(import_graph(tmp_path, type_checking=True)) == [
        "pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"
    ]  # fmt: skip


MAX_SOURCE_LINES = 500  # STYLE.md: files small enough to hold in your head


def test_no_source_file_is_over_the_line_budget() -> None:
    long = []
    for path in sorted(ROOT.glob("packages/*/src/**/*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_SOURCE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long, f"over {MAX_SOURCE_LINES} lines:\n" + "\n".join(long)
