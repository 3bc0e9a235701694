"""The hand-written __init__.pyi matches the compiled module: the same public names, and the same
parameter names as the signatures nanobind reports."""

import ast
import re
from pathlib import Path

import ats_native

STUB = Path(ats_native.__file__).with_name("__init__.pyi")


def stub_functions() -> dict[str, list[str]]:
    """qualified name -> parameter names, from the stub."""
    out: dict[str, list[str]] = {}
    for node in ast.parse(STUB.read_text()).body:
        defs = node.body if isinstance(node, ast.ClassDef) else [node]
        prefix = node.name + "." if isinstance(node, ast.ClassDef) else ""
        for d in defs:
            if isinstance(d, ast.FunctionDef):
                out[prefix + d.name] = [a.arg for a in d.args.args]
    return out


def runtime_params(obj: object) -> list[str]:
    first = obj.__doc__.splitlines()[0]
    inside = first[first.index("(") + 1 : first.rindex(")")]
    inside = re.sub(r"\[[^\]]*\]", "", inside)  # drop subscripts holding commas
    return [p.split(":")[0].split("=")[0].strip() for p in inside.split(",") if p.strip()]


def stub_constants() -> set[str]:
    """Module-level annotated names of the stub (`FINISH_STOP: int`)."""
    body = ast.parse(STUB.read_text()).body
    return {n.target.id for n in body if isinstance(n, ast.AnnAssign)}


def test_stub_names_match_module() -> None:
    stub = stub_functions()
    top = {name.split(".")[0] for name in stub} | stub_constants()
    for name in stub_constants():
        assert isinstance(getattr(ats_native, name), int), name
    assert top == set(ats_native.__all__)
    for name, params in stub.items():
        if name == "version" or name.endswith(".__len__"):
            continue
        obj = ats_native
        for part in name.split("."):
            obj = getattr(obj, part)
        assert runtime_params(obj) == params, name
