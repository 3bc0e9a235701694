/* The forward pass behind ats_session: the KV cache, and the pieces one transformer layer is made
 * of (attention, MoE, MoD routing), each in its own file. Rows are tokens: every call works on a
 * (M, C) matrix of token rows whose sequence and position are given per row. */
#pragma once
#include <stdint.h>

#include <string>
#include <vector>

#include "model_impl.h"

struct ats_session {
    ats_model *model;
    int32_t n_seq;
    int32_t max_len;
    std::vector<int32_t> length; /* tokens in the cache, per sequence */
    /* per layer: keys/values (n_seq, n_kv_head, max_len, head_dim), one kv head's positions
     * consecutive (kv_offset), and slot validity (n_seq, max_len): 1 where this layer computed a
     * key (MoD layers skip tokens). Elements are float, or IEEE half (uint16_t) when the model's
     * kv_f16 is set. */
    std::vector<void *> k, v; /* into kv */
    std::vector<std::vector<uint8_t>> valid;
    ats::HugeBuffer kv; /* every layer's keys and values, on huge pages (huge_pages.h) */
    ats::CudaSession *cuda = nullptr; /* device cuda: the cache lives on the GPU, k/v/valid empty */
};

namespace ats {

/* Offset, in elements, in a layer's key or value cache of kv head kvh's vector at position pos
 * of sequence seq. */
inline int64_t kv_offset(const ats_session *s, int64_t seq, int64_t kvh, int64_t pos) {
    const Config &c = s->model->cfg;
    return ((seq * c.n_kv_head + kvh) * s->max_len + pos) * c.head_dim;
}

/* Rows of one forward call: sequence index and position (= cache slot) of each token. */
struct Rows {
    int64_t M;
    const int32_t *seq;
    const int32_t *pos;
};

/* y = rmsnorm(x) * weight per row (HF LlamaRMSNorm order, sums in double), rows spread over the
 * pool. */
void rms_norm(ThreadPool *pool, const float *x, const float *weight, int64_t M, int64_t C,
              double eps, float *y);

/* The RMSNorm above quantized for the integer path, one pool job: row r of q = Q8_0(rmsnorm(h_r)
 * * weight) with h_r = x_r + a_r written to h (the residual sum, when a is not NULL) or h_r = x_r
 * (a and h NULL); the same values rms_norm then qact_build give. */
void rms_norm_qact(ThreadPool *pool, const Kernels *k, const float *x, const float *a, float *h,
                   const float *weight, int64_t M, int64_t C, double eps, QActRows *q);

/* Causal GQA attention of this layer for the given rows: q/k/v (M, n_head*hd | n_kv*hd) already
 * projected; applies RoPE, writes k/v into the cache at each row's slot, attends over the valid
 * slots <= the row's position of its sequence; out (M, n_head*hd). */
void attention(ats_session *s, int64_t layer, const Rows &rows, float *q, float *k, const float *v,
               float *out);

/* SwiGLU FFN w2(silu(w1 x) * w3 x) over M rows into y (M, C). */
void swiglu_ffn(ats_model *m, const Weight &w1, const Weight &w3, const Weight &w2, const float *x,
                int64_t M, float *y);

/* One SwiGLU FFN of a swiglu_packed call: N quantized input rows x, output y (N, w2.rows). */
struct SwiGLUPart {
    Weight w1, w3, w2; /* all packed (swiglu_is_packed) */
    const QAct *x;
    int64_t N;
    float *y;
};

/* True when the three weights are repacked (the integer path applies). */
bool swiglu_is_packed(const Weight &w1, const Weight &w3, const Weight &w2);

/* Several SwiGLU FFNs at once (the chosen experts and the shared one): every gate and up
 * projection in one pool job, every down projection in one more. */
void swiglu_packed(ats_model *m, const SwiGLUPart *parts, int n_parts);

/* MoE routing of M rows from their router logits (M, E): idx/wts (M, K) the chosen experts and
 * their weights, keep (M, K) 0 for a slot the capacity dropped (moe_ffn's rules, below). */
void moe_route(const Config &c, const Layer &L, const float *logits, int64_t M, int32_t *idx,
               float *wts, uint8_t *keep);

/* MoE FFN (router softmax with temperature, top-k chosen with expert_bias, norm_topk, capacity as
 * ats-model applies it over the rows of this call, per-expert batched SwiGLU, shared experts). */
void moe_ffn(ats_model *m, const Layer &L, const float *x, int64_t M, float *y);

/* MoD decision per row: sel[r] (run the block) and weight[r] (scale of its delta), using the causal
 * predictor (learned routing: predictor logit > 0, weight sigmoid(router logit)) or the position
 * rule (static / random, weight 1). */
void mod_route(ats_model *m, const Layer &L, const float *x, const Rows &rows, uint8_t *sel,
               float *weight);

/* Writes msg into err[cap] (truncated, NUL-terminated) when err is not NULL. */
void set_err(char *err, size_t cap, const std::string &msg);

/* Runs the new tokens through the model (see ats_session_forward); all checks done by the caller. */
void session_forward(ats_session *s, const int32_t *const *ids, const int32_t *n_new,
                     float *last_logits, float *all_logits);

/* ats_session_forward (its checks included), and with last_tokens not NULL also the greedy
 * choice (logits_argmax) of each sequence's last logits in last_tokens[b] for every b with
 * n_new[b] > 0; last_logits may then be NULL (on the GPU only the ids come back). */
int session_forward_tokens(ats_session *s, const int32_t *const *ids, const int32_t *n_new,
                           float *last_logits, float *all_logits, int32_t *last_tokens, char *err,
                           size_t err_cap);

}  // namespace ats
