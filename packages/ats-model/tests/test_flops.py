"""count_params equals the built model for every preset (meta device for the big ones) and the
published Llama-2-7B / Mixtral-8x7B totals; flops_per_token follows its stated formula."""

import dataclasses

import pytest
import torch
from ats_model import MoDConfig, build_model, count_params, flops_per_token, presets
from torch.utils.flop_counter import FlopCounterMode


@pytest.mark.parametrize("name", presets.names())
def test_count_params_equals_built_model(name: str) -> None:
    config = presets.get(name)
    model = build_model(config, device="meta")
    total, active = count_params(config)
    assert total == sum(p.numel() for p in model.parameters())
    assert active <= total
    if config.moe is None:
        assert active == total


def test_llama2_7b_total() -> None:
    total, active = count_params(presets.get("llama2-7b"))
    assert total == active
    assert abs(total - 6.74e9) / 6.74e9 < 0.005


def test_mixtral_8x7b_totals() -> None:
    total, active = count_params(presets.get("mixtral-8x7b"))
    assert abs(total - 46.7e9) / 46.7e9 < 0.005
    assert abs(active - 12.9e9) / 12.9e9 < 0.005


def test_dense_flops_formula() -> None:
    c = presets.get("124m-dense")
    n_matmul = count_params(c)[0] - c.dim * (
        2 * c.n_layer + 1
    )  # minus norms; tied head counted once
    expect = 6 * n_matmul + 12 * c.n_layer * c.n_head * c.head_dim * 1024
    assert flops_per_token(c, 1024) == pytest.approx(expect, rel=1e-12)


def test_moe_counts_active_and_mod_scales_by_capacity() -> None:
    dense, moe = presets.get("124m-dense"), presets.get("124m-moe")
    # 8 experts top-2 at half width: active FFN = dense FFN (+ a tiny router)
    assert flops_per_token(moe, 512) == pytest.approx(flops_per_token(dense, 512), rel=2e-3)
    full = dataclasses.replace(dense, family="mod", mod=MoDConfig(capacity=1.0, placement="all"))
    half = dataclasses.replace(full, mod=MoDConfig(capacity=0.5, placement="all"))
    router = 6 * (count_params(full)[0] - count_params(dense)[0])  # MoD router + predictor
    head = 6 * dense.vocab_size * dense.dim
    attn = 12 * dense.n_layer * dense.n_head * dense.head_dim * 512
    blocks = flops_per_token(full, 512) - head - attn - router
    expect_half = head + router + 0.5 * blocks + 0.25 * attn
    assert flops_per_token(half, 512) == pytest.approx(expect_half, rel=1e-12)


def test_formula_matches_flop_counter_on_tiny_dense() -> None:
    """The analytic count against torch's FlopCounterMode on a real forward + backward: matmuls
    exactly 6 * N_matmul per token; attention forward 4 * T * d_attn per layer where torch counts
    the CPU SDPA kernel (its backward convention, 2.5x forward, differs from the formula's 2x)."""
    c = presets.get("tiny-dense")
    model = build_model(c)
    T = 64
    idx = torch.randint(0, c.vocab_size, (2, T))
    with FlopCounterMode(display=False) as counter:
        model(idx, targets=idx).loss.backward()
    counts = {str(k): v / idx.numel() for k, v in counter.get_flop_counts()["Global"].items()}
    d_attn = c.n_head * c.head_dim
    attn_formula = 12 * d_attn * T * c.n_layer
    assert counts.pop("aten.mm") == flops_per_token(c, T) - attn_formula
    sdpa_fwd = sum(v for k, v in counts.items() if "dot_product" in k and "backward" not in k)
    assert sdpa_fwd in (0, 4 * d_attn * T * c.n_layer)


def test_bad_seq_len() -> None:
    with pytest.raises(ValueError, match="seq_len = 0"):
        flops_per_token(presets.get("tiny-dense"), 0)
