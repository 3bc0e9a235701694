"""RoPE tables and rotation against HF Llama (default and llama3 scaling), a pairwise-rotation
loop, and gradcheck."""

import math
from types import SimpleNamespace

import pytest
import torch
from ats_kernels import ref_rope, rope_tables
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb


def _hf_tables(head_dim: int, seq: int, theta: float, scaling: SimpleNamespace | None):
    params = {"rope_type": "default", "rope_theta": theta}
    if scaling is not None:
        params = {
            "rope_type": "llama3",
            "rope_theta": theta,
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_seq_len,
        }
    cfg = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        max_position_embeddings=seq,
        rope_parameters=params,
    )
    emb = LlamaRotaryEmbedding(cfg)
    cos, sin = emb(torch.zeros(1, seq, head_dim * 2), torch.arange(seq)[None])
    return cos[0], sin[0]


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        SimpleNamespace(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=64
        ),
    ],
)
def test_tables_match_hf(scaling: SimpleNamespace | None) -> None:
    cos, sin = rope_tables(32, 300, 500000.0, scaling)
    hf_cos, hf_sin = _hf_tables(32, 300, 500000.0, scaling)
    # HF builds in fp32, we build in fp64 and cast: equal to fp32 rounding of the angle
    torch.testing.assert_close(cos, hf_cos, atol=2e-5, rtol=0)
    torch.testing.assert_close(sin, hf_sin, atol=2e-5, rtol=0)


def test_tables_are_fp64_exact() -> None:
    cos, _ = rope_tables(8, 5000, 10000.0, dtype=torch.float64)
    t, i = 4999, 3
    assert cos[t, i].item() == pytest.approx(math.cos(t * 10000.0 ** (-2 * i / 8)), abs=1e-12)


def test_rotation_matches_pair_loop_and_hf() -> None:
    torch.manual_seed(0)
    B, nh, nkv, T, hd = 2, 4, 2, 5, 6
    q = torch.randn(B, nh, T, hd, dtype=torch.float64)
    k = torch.randn(B, nkv, T, hd, dtype=torch.float64)
    cos, sin = rope_tables(hd, T, 10000.0, dtype=torch.float64)
    q_out, k_out = ref_rope(q, k, cos, sin)
    half = hd // 2
    expect = q.clone()
    for t in range(T):
        for i in range(half):
            ang = t * 10000.0 ** (-2 * i / hd)
            a, b = q[..., t, i], q[..., t, i + half]  # half-split pair (i, i + hd/2)
            expect[..., t, i] = a * math.cos(ang) - b * math.sin(ang)
            expect[..., t, i + half] = b * math.cos(ang) + a * math.sin(ang)
    torch.testing.assert_close(q_out, expect)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    torch.testing.assert_close(q_out, hf_q)
    torch.testing.assert_close(k_out, hf_k)


def test_per_batch_positions_equal_shared_table() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 4, 8), torch.randn(2, 1, 4, 8)
    cos, sin = rope_tables(8, 16, 10000.0)
    pos = torch.tensor([[3, 4, 5, 6], [0, 1, 2, 3]])
    q_b, k_b = ref_rope(q, k, cos[pos], sin[pos])  # (B, T, hd) tables
    for b in range(2):
        q_s, k_s = ref_rope(q[b : b + 1], k[b : b + 1], cos[pos[b]], sin[pos[b]])
        torch.testing.assert_close(q_b[b : b + 1], q_s)
        torch.testing.assert_close(k_b[b : b + 1], k_s)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="head_dim = 7 must be even"):
        rope_tables(7, 4)
    with pytest.raises(ValueError, match="cos must be"):
        ref_rope(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.zeros(4), torch.zeros(4))


def test_gradcheck() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    cos, sin = rope_tables(4, 3, 10000.0, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: ref_rope(a, b, cos, sin), (q, k))


def test_rope_qkv_splits_one_projection_and_rotates_q_and_k() -> None:
    from ats_kernels import ref_rope_qkv

    torch.manual_seed(0)
    B, T, H, Hk, hd = 2, 5, 4, 2, 6
    qkv = torch.randn(B, T, (H + 2 * Hk) * hd, dtype=torch.float64, requires_grad=True)
    cos, sin = rope_tables(hd, T, dtype=torch.float64)
    q, k, v = ref_rope_qkv(qkv, cos, sin, H, Hk)
    heads = qkv.view(B, T, H + 2 * Hk, hd).transpose(1, 2)  # (B, heads, T, hd)
    q_ref, k_ref = ref_rope(heads[:, :H], heads[:, H : H + Hk], cos, sin)
    torch.testing.assert_close(q, q_ref)
    torch.testing.assert_close(k, k_ref)
    torch.testing.assert_close(v, heads[:, H + Hk :])
    assert torch.autograd.gradcheck(lambda x: ref_rope_qkv(x, cos, sin, H, Hk), (qkv,))
