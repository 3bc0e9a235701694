"""GQA attention against an explicit per-head loop with HF repeat_kv head order, and the mask."""

import math

import torch
from ats_kernels import select
from ats_model import ModelConfig
from ats_model.layers.attention import Attention, causal_mask
from ats_model.layers.rope import build_rope_tables


def _manual(
    att: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, valid: torch.Tensor
):
    """Loop over batch, query head, query and key positions; q head h uses kv head h // g."""
    B, T, _ = x.shape
    nh, nkv, hd = att.n_head, att.n_kv_head, att.head_dim
    q = (x @ att.wq.weight.T).view(B, T, nh, hd)
    k = (x @ att.wk.weight.T).view(B, T, nkv, hd)
    v = (x @ att.wv.weight.T).view(B, T, nkv, hd)

    def rot(t: torch.Tensor) -> torch.Tensor:  # (..., T, hd) half-split rotation
        t1, t2 = t[..., : hd // 2], t[..., hd // 2 :]
        return t * cos[:, None] + torch.cat([-t2, t1], -1) * sin[:, None]

    q, k = rot(q), rot(k)
    out = torch.zeros(B, T, nh, hd, dtype=x.dtype)
    for b in range(B):
        for h in range(nh):
            j = h // (nh // nkv)
            for t in range(T):
                keys = [s for s in range(t + 1) if valid[b, s]] or [t]
                scores = torch.stack([q[b, t, h] @ k[b, s, j] / math.sqrt(hd) for s in keys])
                p = torch.softmax(scores, 0)
                out[b, t, h] = sum(p[i] * v[b, s, j] for i, s in enumerate(keys))
    return out.reshape(B, T, nh * hd) @ att.wo.weight.T


def test_gqa_matches_loop_with_padding() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=5, dim=16, n_layer=1, n_head=4, n_kv_head=2, ffn_dim=8, max_seq_len=8
    )
    att = Attention(cfg, select("reference")).double()
    for p in att.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    cos, sin = build_rope_tables(cfg, "cpu", torch.float64)
    cos, sin = cos[:5], sin[:5]
    all_valid = torch.ones(2, 5, dtype=torch.bool)
    torch.testing.assert_close(att(x, cos, sin, None), _manual(att, x, cos, sin, all_valid))
    valid = all_valid.clone()
    valid[1, :2] = False  # left padding on sequence 1
    mask = causal_mask(torch.arange(5), valid)
    got = att(x, cos, sin, mask)
    want = _manual(att, x, cos, sin, valid)
    torch.testing.assert_close(got, want)


def test_causal_mask_keeps_own_slot() -> None:
    valid = torch.tensor([[False, True, True]])
    m = causal_mask(torch.arange(3), valid)[0, 0]
    assert m.tolist() == [[True, False, False], [False, True, False], [False, True, True]]
