"""No load path of ats_train unpickles (issue 22): a checkpoint from elsewhere is read as data. The
one torch.load is DeepSpeed's, weights-only (backends/deepspeed_load.py); torch.distributed.
checkpoint's readers, which pickle.load their metadata, are not imported (its state_dict API,
which reads no file, is)."""

import ast
from pathlib import Path

import ats_train

SOURCES = sorted(Path(ats_train.__file__).parent.rglob("*.py"))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _problems(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            if name.split(".")[-1] in ("Unpickler", "FileSystemReader") or name in (
                "pickle.load",
                "pickle.loads",
                "dcp.load",
            ):
                found.append(name)
            if name == "torch.load":
                weights_only = keywords.get("weights_only")
                if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                    found.append("torch.load without weights_only=True")
            allow = keywords.get("allow_pickle")
            if isinstance(allow, ast.Constant) and allow.value is True:
                found.append(f"{name}(allow_pickle=True)")
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [f"{node.module}.{a.name}" for a in node.names]
        for module in modules:
            if module.startswith("torch.distributed.checkpoint") and not module.startswith(
                "torch.distributed.checkpoint.state_dict"
            ):
                found.append(f"import {module}")
            allowed = module == "pickle.UnpicklingError"  # to catch what torch's loader refused
            if module.split(".")[0] in ("pickle", "dill", "cloudpickle", "joblib") and not allowed:
                found.append(f"import {module}")
    return found


def test_no_source_unpickles() -> None:
    assert len(SOURCES) > 20
    found = {
        path.name: problems
        for path in SOURCES
        if (problems := _problems(ast.parse(path.read_text())))
    }
    assert found == {}


def test_the_check_finds_what_the_dcp_reader_did() -> None:
    """The control: the removed torch.distributed.checkpoint loader and pickle calls are found."""
    code = (
        "import torch.distributed.checkpoint as dcp\n"
        "from torch.distributed.checkpoint import FileSystemReader\n"
        "dcp.load(state, checkpoint_id=d)\n"
        "import pickle\n"
        "pickle.load(f)\n"
        "torch.load(p)\n"
        "torch.load(p, weights_only=False)\n"
        "np.load(p, allow_pickle=True)\n"
    )
    assert sorted(_problems(ast.parse(code))) == [
        "dcp.load",
        "import pickle",
        "import torch.distributed.checkpoint",
        "import torch.distributed.checkpoint.FileSystemReader",
        "np.load(allow_pickle=True)",
        "pickle.load",
        "torch.load without weights_only=True",
        "torch.load without weights_only=True",
    ]
