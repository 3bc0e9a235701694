"""Parameter counts and training FLOPs per token, from the config alone (no model built).

flops_per_token = 6 * N_matmul_active + 12 * sum_layers(n_head * head_dim * T)            (PaLM, App. B)
- N_matmul_active: weights in matmuls one token passes through: attention projections, the FFN
  (for MoE: router + top_k experts + shared experts), MoD router and predictor, and the LM head
  (counted even when tied to the embedding; the embedding lookup itself is not a matmul).
- The attention term counts QK^T and AV over all T keys (non-causal convention, as PaLM and
  torch.utils.flop_counter count SDPA), forward + backward = 3x forward's 4 * T * d_attn.
- MoD blocks process a fraction c of the tokens: their matmuls scale by c, their attention by c^2
  (c*T queries over c*T keys); router and predictor run on every token.
"""

from ats_model.config import ModelConfig


def _attn_params(c: ModelConfig) -> int:
    q = c.dim * c.n_head * c.head_dim
    kv = 2 * c.dim * c.n_kv_head * c.head_dim
    return q + kv + c.n_head * c.head_dim * c.dim  # wq + wk + wv + wo


def _ffn_params(c: ModelConfig) -> tuple[int, int]:
    """(total, active per token) of one FFN."""
    mlp = 3 * c.dim * c.ffn_dim
    if c.moe is None:
        return mlp, mlp
    router = c.moe.n_experts * c.dim
    shared = 3 * c.dim * c.moe.n_shared_experts * c.ffn_dim
    total = router + c.moe.n_experts * mlp + shared
    return total, router + c.moe.top_k * mlp + shared


def _mod_params(c: ModelConfig, layer_idx: int) -> int:
    """MoD router (1, C) and predictor (H, C) + (1, H), learned routing only."""
    if not c.is_mod_layer(layer_idx) or c.mod.routing != "learned":
        return 0
    return c.dim + c.mod.predictor_dim * c.dim + c.mod.predictor_dim


def count_params(config: ModelConfig) -> tuple[int, int]:
    """(total, active per token) parameter counts, embeddings included, buffers excluded."""
    c = config
    embed = c.vocab_size * c.dim
    head = 0 if c.tie_embeddings else c.vocab_size * c.dim
    total = active = embed + head + c.dim  # + final norm
    ffn_total, ffn_active = _ffn_params(c)
    per_layer = 2 * c.dim + _attn_params(c)  # two norms + attention
    for i in range(c.n_layer):
        mod = _mod_params(c, i)
        total += per_layer + ffn_total + mod
        active += per_layer + ffn_active + mod
    return total, active


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training (forward + backward) FLOPs per token at sequence length `seq_len`."""
    if seq_len < 1:
        raise ValueError(f"flops_per_token: seq_len = {seq_len} must be >= 1")
    c = config
    _, ffn_active = _ffn_params(c)
    d_attn = c.n_head * c.head_dim
    matmul = float(c.vocab_size * c.dim)  # LM head
    attention = 0.0
    for i in range(c.n_layer):
        block = _attn_params(c) + ffn_active
        attn = 12.0 * d_attn * seq_len
        if c.is_mod_layer(i):
            cap = c.mod.capacity
            block, attn = block * cap, attn * cap * cap
        matmul += block + _mod_params(c, i)
        attention += attn
    return 6.0 * matmul + attention
