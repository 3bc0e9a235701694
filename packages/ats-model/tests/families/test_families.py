"""The family registry: each family builds the blocks its name promises; unknown names suggest."""

import pytest
from ats_model import MoDConfig, build_model, families
from ats_model.layers.block import Block
from ats_model.layers.ffn import SwiGLUFFN
from ats_model.layers.mod import MoDBlock
from ats_model.layers.moe import MoEFFN


def test_registered() -> None:
    assert families.names() == ["dense", "hybrid", "mod", "moe"]


@pytest.mark.parametrize(
    "family,ffn,mod_at",
    [
        ("dense", SwiGLUFFN, []),
        ("moe", MoEFFN, []),
        ("mod", SwiGLUFFN, [1, 3]),
        ("hybrid", MoEFFN, [1, 3]),
    ],
)
def test_blocks_per_family(make_config, family: str, ffn: type, mod_at: list[int]) -> None:
    kw = {"n_layer": 4}
    if family in ("mod", "hybrid"):
        kw["mod"] = MoDConfig(capacity=0.5, placement="every_n", every_n=2)
    model = build_model(make_config(family, **kw), device="meta")
    assert all(isinstance(b, Block) and isinstance(b.ffn, ffn) for b in model.layers)
    assert [i for i, b in enumerate(model.layers) if isinstance(b, MoDBlock)] == mod_at
    assert len(model.mod_layers()) == len(mod_at)
    assert len(model.moe_layers()) == (4 if ffn is MoEFFN else 0)


def test_unknown_family() -> None:
    with pytest.raises(KeyError, match="did you mean 'dense'"):
        families.get("dens")
