/* One forward call over the new tokens of several sequences at once:
 *
 *   ids -> embeddings -> [block | MoD block] x n_layer -> RMSNorm -> LM head -> logits
 *   block:      h = x + attn(attn_norm(x));  x = h + ffn(ffn_norm(h))
 *   MoD block:  selected rows only: x = x + w * (a + f), a/f computed on the selected rows
 *
 * Tokens of all sequences are stacked as rows so every matmul runs once per layer; attention
 * reads each row's own sequence from the KV cache. */
#include <string.h>

#include <vector>

#include "forward.h"

namespace ats {

/* A residual sum still owed to x (M, C): x = h + f, with h = x + a the block's own sum (h NULL:
 * nothing owed). The integer path hands it to the next block, whose first norm adds it in its
 * own pool job; the same adds in the same order as x = (x + a) + f. */
struct Owed {
    const float *h, *f;
};

/* x = h + f over the pool, when something is owed */
static void settle(ThreadPool *pool, float *x, const Owed &owed, int64_t M, int64_t C) {
    if (!owed.h) return;
    pool->run_rows((int)M, M * C, [&](int r) {
        for (int64_t i = (int64_t)r * C; i < (int64_t)(r + 1) * C; i++) {
            x[i] = owed.h[i] + owed.f[i];
        }
    });
}

/* a (M, C) = attention output, f (M, C) = FFN output, for the rows x (M, C) once `in` is added
 * to x (then written back to x). Returns what the caller still owes x: {x + a, f} on the integer
 * path, else nothing, and x + a + f is the caller's to form. */
static Owed block(ats_session *s, int64_t li, float *x, const Owed &in, const Rows &rows, float *a,
                  float *f) {
    ats_model *m = s->model;
    const Config &c = m->cfg;
    const Layer &L = m->layers[(size_t)li];
    const int64_t M = rows.M, C = c.dim, H = c.n_head * c.head_dim, KV = c.n_kv_head * c.head_dim;
    ThreadPool *pool = m->pool.get();
    /* scratch reused across layers and calls: fresh multi-100-KiB vectors per layer cost page
     * faults at prefill */
    thread_local std::vector<float> h, q, k, v, att, hn;
    h.resize((size_t)(M * C));
    q.resize((size_t)(M * H));
    k.resize((size_t)(M * KV));
    v.resize((size_t)(M * KV));
    att.resize((size_t)(M * H));
    hn.resize((size_t)(M * C));
    /* integer path: each norm writes the quantized activations its matmuls read (one pool job
     * instead of a norm, a quantization and, before the FFN, a serial residual add) */
    thread_local QActRows xq;
    if (L.wq.packed && L.wk.packed && L.wv.packed) {
        /* x = in.h + in.f first when a sum is owed (written back to x) */
        const float *x_in = in.h ? in.h : x;
        rms_norm_qact(pool, m->kernels, x_in, in.f, in.h ? x : nullptr, L.attn_norm, M, C,
                      c.norm_eps, &xq);
        const MatmulJob jobs[3] = {{L.wq, xq.rows.data(), M, q.data()},
                                   {L.wk, xq.rows.data(), M, k.data()},
                                   {L.wv, xq.rows.data(), M, v.data()}};
        matmul_jobs(pool, m->kernels, jobs, 3);
    } else {
        settle(pool, x, in, M, C);
        rms_norm(pool, x, L.attn_norm, M, C, c.norm_eps, h.data());
        const Weight *qkv_w[3] = {&L.wq, &L.wk, &L.wv};
        float *qkv_y[3] = {q.data(), k.data(), v.data()};
        matmul_same_x(pool, m->kernels, qkv_w, 3, h.data(), M, qkv_y);
    }
    attention(s, li, rows, q.data(), k.data(), v.data(), att.data());
    matmul(pool, m->kernels, L.wo, att.data(), M, a);
    if (!c.has_moe && swiglu_is_packed(L.w1, L.w3, L.w2)) {
        rms_norm_qact(pool, m->kernels, x, a, h.data(), L.ffn_norm, M, C, c.norm_eps, &xq);
        SwiGLUPart part{L.w1, L.w3, L.w2, xq.rows.data(), M, f};
        swiglu_packed(m, &part, 1);
        return {h.data(), f};
    }
    for (int64_t i = 0; i < M * C; i++) h[(size_t)i] = x[i] + a[i];
    rms_norm(pool, h.data(), L.ffn_norm, M, C, c.norm_eps, hn.data());
    if (c.has_moe) {
        moe_ffn(m, L, hn.data(), M, f);
    } else {
        swiglu_ffn(m, L.w1, L.w3, L.w2, hn.data(), M, f);
    }
    return {nullptr, nullptr};
}

static void mod_block(ats_session *s, int64_t li, float *x, const Rows &rows) {
    ats_model *m = s->model;
    const int64_t C = m->cfg.dim, M = rows.M;
    std::vector<uint8_t> sel((size_t)M);
    std::vector<float> weight((size_t)M);
    mod_route(m, m->layers[(size_t)li], x, rows, sel.data(), weight.data());
    std::vector<int64_t> picked;
    uint8_t *valid = s->valid[(size_t)li].data();
    for (int64_t r = 0; r < M; r++) {
        if (sel[(size_t)r]) picked.push_back(r);
        else valid[(int64_t)rows.seq[r] * s->max_len + rows.pos[r]] = 0; /* never attended to */
    }
    if (picked.empty()) return;
    int64_t K = (int64_t)picked.size();
    std::vector<float> xs((size_t)(K * C)), a((size_t)(K * C)), f((size_t)(K * C));
    std::vector<int32_t> seq((size_t)K), pos((size_t)K);
    for (int64_t i = 0; i < K; i++) {
        int64_t r = picked[(size_t)i];
        memcpy(xs.data() + i * C, x + r * C, (size_t)C * sizeof(float));
        seq[(size_t)i] = rows.seq[r];
        pos[(size_t)i] = rows.pos[r];
    }
    Rows sub{K, seq.data(), pos.data()};
    block(s, li, xs.data(), {nullptr, nullptr}, sub, a.data(), f.data()); /* uses a and f */
    for (int64_t i = 0; i < K; i++) {
        int64_t r = picked[(size_t)i];
        float w = weight[(size_t)r];
        for (int64_t j = 0; j < C; j++) x[r * C + j] += (a[(size_t)(i * C + j)] + f[(size_t)(i * C + j)]) * w;
    }
}

void session_forward(ats_session *s, const int32_t *const *ids, const int32_t *n_new,
                     float *last_logits, float *all_logits) {
    ats_model *m = s->model;
    const Config &c = m->cfg;
    const int64_t C = c.dim, V = c.vocab_size;
    std::vector<int32_t> seq, pos, tok;
    for (int32_t b = 0; b < s->n_seq; b++) {
        for (int32_t t = 0; t < n_new[b]; t++) {
            seq.push_back(b);
            pos.push_back(s->length[(size_t)b] + t);
            tok.push_back(ids[b][t]);
        }
    }
    const int64_t M = (int64_t)tok.size();
    if (M == 0) return;
    Rows rows{M, seq.data(), pos.data()};
    /* scratch reused across calls: fresh (M, C) vectors are fresh pages, faulted in per prefill */
    thread_local std::vector<float> x, a, f;
    x.resize((size_t)(M * C));
    a.resize((size_t)(M * C));
    f.resize((size_t)(M * C));
    for (int64_t r = 0; r < M; r++) {
        memcpy(x.data() + r * C, m->tok_embeddings + (int64_t)tok[(size_t)r] * C, (size_t)C * sizeof(float));
    }
    ThreadPool *pool = m->pool.get();
    Owed owed{nullptr, nullptr};
    for (int64_t li = 0; li < c.n_layer; li++) {
        if (m->layers[(size_t)li].is_mod) {
            settle(pool, x.data(), owed, M, C);
            owed = {nullptr, nullptr};
            mod_block(s, li, x.data(), rows);
            continue;
        }
        owed = block(s, li, x.data(), owed, rows, a.data(), f.data());
        if (owed.h) continue;
        float *xp = x.data();
        const float *ap = a.data(), *fp = f.data(); /* the caller's thread_locals, for the pool */
        pool->run_rows((int)M, M * C, [&](int r) {
            for (int64_t i = (int64_t)r * C; i < (int64_t)(r + 1) * C; i++) {
                xp[i] = (xp[i] + ap[i]) + fp[i];
            }
        });
    }
    settle(pool, x.data(), owed, M, C);
    for (int32_t b = 0; b < s->n_seq; b++) s->length[(size_t)b] += n_new[b];

    /* LM head: every row when all logits are wanted, else each sequence's last row */
    std::vector<int64_t> out_rows;
    if (all_logits) {
        for (int64_t r = 0; r < M; r++) out_rows.push_back(r);
    } else {
        for (int64_t r = 0; r < M; r++) {
            if (r + 1 == M || seq[(size_t)(r + 1)] != seq[(size_t)r]) out_rows.push_back(r);
        }
    }
    int64_t R = (int64_t)out_rows.size();
    std::vector<float> xs((size_t)(R * C)), hn((size_t)(R * C));
    for (int64_t i = 0; i < R; i++) {
        memcpy(xs.data() + i * C, x.data() + out_rows[(size_t)i] * C, (size_t)C * sizeof(float));
    }
    rms_norm(m->pool.get(), xs.data(), m->norm, R, C, c.norm_eps, hn.data());
    float *dst = all_logits;
    std::vector<float> tmp;
    if (!dst) {
        tmp.resize((size_t)(R * V));
        dst = tmp.data();
    }
    matmul(m->pool.get(), m->kernels, m->output, hn.data(), R, dst);
    if (last_logits) {
        for (int64_t i = 0; i < R; i++) {
            int64_t r = out_rows[(size_t)i];
            if (r + 1 == M || seq[(size_t)(r + 1)] != seq[(size_t)r]) {
                memcpy(last_logits + (int64_t)seq[(size_t)r] * V, dst + i * V, (size_t)V * sizeof(float));
            }
        }
    }
}

}  // namespace ats
