"""Model families: one file each (dense, moe, mod, hybrid), registered here as a FamilySpec.

A family decides what block sits at each depth; the Transformer around the blocks is shared.
"""

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from ats_kernels import KernelSet
from torch import nn

from ats_model.config import ModelConfig


@dataclass(frozen=True)
class FamilySpec:
    name: str
    description: str
    build_block: Callable[[ModelConfig, int, KernelSet], nn.Module]


_REGISTRY: dict[str, FamilySpec] = {}


def register(spec: FamilySpec) -> FamilySpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"model family {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> FamilySpec:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, sorted(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown model family {name!r}{hint}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def names() -> list[str]:
    return sorted(_REGISTRY)


from ats_model.families import dense, hybrid, mod, moe  # noqa: E402  (each registers itself)

__all__ = ["FamilySpec", "dense", "get", "hybrid", "mod", "moe", "names", "register"]
