"""ModelConfig validation (clear errors naming field, value and expectation) and dict round trip."""

import dataclasses

import pytest
from ats_model import MoDConfig, ModelConfig, MoEConfig, RopeScaling, presets


def _cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=32, dim=16, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=24, max_seq_len=16)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(dim=20, n_head=4, head_dim=5), r"head_dim = 5 is invalid: expected an even int"),
        (
            dict(n_head=4, n_kv_head=3),
            r"n_kv_head = 3 is invalid: expected a divisor of n_head \(4\)",
        ),
        (
            dict(family="moe"),
            r"ModelConfig.moe = None is invalid: expected a MoEConfig for family 'moe'",
        ),
        (dict(family="dense", moe=MoEConfig()), r"expected None for family 'dense'"),
        (dict(family="mod"), r"expected a MoDConfig for family 'mod'"),
        (dict(family="hybird"), r"did you mean 'hybrid'"),
        (dict(vocab_size=0), r"vocab_size = 0 is invalid"),
        (dict(norm_eps=0.0), r"norm_eps = 0.0 is invalid"),
        (
            dict(family="mod", n_layer=1, mod=MoDConfig(placement="every_n", every_n=2)),
            r"routing >= 1 of 1",
        ),
    ],
)
def test_invalid_configs(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(**kw)


@pytest.mark.parametrize(
    "make,match",
    [
        (
            lambda: MoEConfig(n_experts=4, top_k=5),
            r"top_k = 5 is invalid: expected 1 <= top_k <= n_experts \(4\)",
        ),
        (lambda: MoEConfig(top_k=0), r"top_k = 0"),
        (lambda: MoEConfig(capacity_factor=0.0), r"capacity_factor = 0.0"),
        (lambda: MoEConfig(router_temperature=-1.0), r"router_temperature"),
        (lambda: MoDConfig(capacity=1.5), r"capacity = 1.5"),
        (lambda: MoDConfig(routing="fancy"), r"routing = 'fancy'"),
        (lambda: MoDConfig(placement="odd"), r"placement = 'odd'"),
        (lambda: RopeScaling(factor=0.5), r"factor = 0.5"),
    ],
)
def test_invalid_sub_configs(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_defaults_resolved() -> None:
    c = ModelConfig(vocab_size=10, dim=32, n_layer=1, n_head=4, ffn_dim=8, max_seq_len=8)
    assert c.n_kv_head == 4 and c.head_dim == 8 and c.n_rep == 1


@pytest.mark.parametrize("name", ["tiny-hybrid", "mixtral-8x7b", "1b-mod"])
def test_dict_round_trip(name: str) -> None:
    c = presets.get(name)
    c = dataclasses.replace(c, rope_scaling=RopeScaling())
    d = c.to_dict()
    assert d["format_version"] == 1
    assert ModelConfig.from_dict(d) == c


def test_from_dict_errors() -> None:
    d = presets.get("tiny-moe").to_dict()
    with pytest.raises(ValueError, match=r"unknown field 'n_layers' \(did you mean 'n_layer'\?\)"):
        ModelConfig.from_dict({**d, "n_layers": 3})
    with pytest.raises(ValueError, match=r"ModelConfig.moe: unknown field 'experts'"):
        ModelConfig.from_dict({**d, "moe": {"experts": 3}})
    with pytest.raises(ValueError, match=r"format_version = 99"):
        ModelConfig.from_dict({**d, "format_version": 99})


def test_mod_placement() -> None:
    every = [MoDConfig(placement="every_n", every_n=3).routes_layer(i, 7) for i in range(7)]
    assert every == [False, False, True, False, False, True, False]
    later = [MoDConfig(placement="later_half").routes_layer(i, 6) for i in range(6)]
    assert later == [False, False, False, True, True, True]
    assert all(MoDConfig(placement="all").routes_layer(i, 3) for i in range(3))
