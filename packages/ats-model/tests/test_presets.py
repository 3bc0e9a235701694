"""Presets: every name builds a valid config of the family its name says; unknown names suggest."""

import pytest
from ats_model import count_params, presets


def test_names_cover_sizes_and_families() -> None:
    names = presets.names()
    for size in ("tiny", "20m", "124m", "1b", "7b", "10b", "70b", "300b"):
        for family in ("dense", "moe", "mod", "hybrid"):
            assert f"{size}-{family}" in names
    assert "llama2-7b" in names and "mixtral-8x7b" in names


@pytest.mark.parametrize("name", presets.names())
def test_family_matches_name(name: str) -> None:
    c = presets.get(name)
    family = name.split("-")[-1]
    if family in ("dense", "moe", "mod", "hybrid"):
        assert c.family == family
    if c.moe is not None and not name.startswith("tiny"):
        assert 8 <= c.moe.n_experts <= 64


def test_get_returns_fresh_config() -> None:
    a = presets.get("tiny-moe")
    a.moe.top_k = 1
    assert presets.get("tiny-moe").moe.top_k == 2


def test_unknown_name_suggests() -> None:
    with pytest.raises(
        KeyError, match=r"unknown model preset 'tiny-moee'; did you mean 'tiny-moe'"
    ):
        presets.get("tiny-moee")


def test_10b_dense_state_exceeds_one_h200() -> None:
    """The offload preset (issue 6): 9-10B parameters, so mixed-precision AdamW's ~16 bytes per
    parameter (bf16 weights and grads, fp32 master, Adam m and v) exceed an H200's 141 GB."""
    total, active = count_params(presets.get("10b-dense"))
    assert total == active == 9_422_852_096
    assert 9e9 <= total <= 10e9
    assert 16 * total > 141e9
