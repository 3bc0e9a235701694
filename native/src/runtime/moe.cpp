/* Mixture-of-Experts FFN, as ats-model's MoEFFN in eval mode:
 *   probs = softmax(router(x) / temperature)                    (fp32)
 *   top-k experts by probs + expert_bias (DeepSeek-V3 aux-loss-free: bias picks, never weighs)
 *   weights = probs at the chosen experts, renormalized to sum 1 when norm_topk
 *   capacity_factor set: ceil(cf * N * k / E) slots per expert, 1st choices of all tokens served
 *   before any 2nd choice, earlier tokens first (GShard / Switch); a dropped slot adds nothing
 *   y = sum_j weights_j * expert_j(x) + shared(x)
 * Tokens are grouped per expert so each expert runs one batched SwiGLU over its rows. On packed
 * int8/int4 experts x is quantized once, each expert reads its tokens' quantized rows in place,
 * and the gate/up (then the down) projections of every chosen expert and the shared one run as
 * one pool job (issue 7: at decode a job per matmul cost a wake-up and a re-quantization). */
#include <math.h>
#include <string.h>

#include <vector>

#include "forward.h"

namespace ats {

/* Slots s (token s / K, choice s % K) of expert e, for the kept slots. */
static void expert_slots(const int32_t *idx, const uint8_t *keep, int64_t n_slots, int64_t e,
                         std::vector<int64_t> *slots) {
    slots->clear();
    for (int64_t s = 0; s < n_slots; s++) {
        if (idx[s] == e && keep[s]) slots->push_back(s);
    }
}

/* fp32 (or unpacked) experts: one batched SwiGLU per expert over its gathered rows. */
static void experts_dense(ats_model *m, const Layer &L, const float *x, int64_t M,
                          const int32_t *idx, const uint8_t *keep, float *y_slots, float *shared) {
    const Config &c = m->cfg;
    const int64_t E = c.n_experts, K = c.top_k, C = c.dim;
    std::vector<float> xe, ye;
    std::vector<int64_t> slots;
    for (int64_t e = 0; e < E; e++) {
        expert_slots(idx, keep, M * K, e, &slots);
        if (slots.empty()) continue;
        int64_t Me = (int64_t)slots.size();
        xe.resize((size_t)(Me * C));
        ye.resize((size_t)(Me * C));
        for (int64_t r = 0; r < Me; r++) {
            memcpy(xe.data() + r * C, x + (slots[(size_t)r] / K) * C, (size_t)C * sizeof(float));
        }
        swiglu_ffn(m, weight_slice(L.ew1, e), weight_slice(L.ew3, e), weight_slice(L.ew2, e),
                   xe.data(), Me, ye.data());
        for (int64_t r = 0; r < Me; r++) {
            memcpy(y_slots + slots[(size_t)r] * C, ye.data() + r * C, (size_t)C * sizeof(float));
        }
    }
    if (L.has_shared) swiglu_ffn(m, L.sw1, L.sw3, L.sw2, x, M, shared);
}

/* Packed experts: x quantized once; each chosen expert reads its tokens' QAct rows (no copies),
 * and every expert (plus the shared one) runs in the same two pool jobs (swiglu_packed). */
static void experts_packed(ats_model *m, const Layer &L, const float *x, int64_t M,
                           const int32_t *idx, const uint8_t *keep, float *y_slots,
                           float *shared) {
    const Config &c = m->cfg;
    const int64_t E = c.n_experts, K = c.top_k, C = c.dim;
    thread_local QActRows xq;
    thread_local std::vector<QAct> gathered;    /* (kept slots) QAct rows, grouped by expert */
    thread_local std::vector<int64_t> order;     /* kept slots, grouped by expert */
    thread_local std::vector<float> y_sorted;    /* (kept slots, C) expert outputs, same order */
    thread_local std::vector<SwiGLUPart> parts;
    thread_local std::vector<int64_t> slots, start;
    qact_build(m->pool.get(), m->kernels, x, M, C, &xq);
    order.clear();
    gathered.clear();
    parts.clear();
    start.clear();
    for (int64_t e = 0; e < E; e++) {
        expert_slots(idx, keep, M * K, e, &slots);
        if (slots.empty()) continue;
        start.push_back((int64_t)order.size());
        for (int64_t s : slots) {
            order.push_back(s);
            gathered.push_back(xq.rows[(size_t)(s / K)]);
        }
        parts.push_back({weight_slice(L.ew1, e), weight_slice(L.ew3, e), weight_slice(L.ew2, e),
                         nullptr, (int64_t)slots.size(), nullptr});
    }
    y_sorted.resize(order.size() * (size_t)C);
    for (size_t p = 0; p < parts.size(); p++) { /* gathered no longer grows: pointers are stable */
        parts[p].x = gathered.data() + start[p];
        parts[p].y = y_sorted.data() + start[p] * C;
    }
    bool shared_packed = L.has_shared && swiglu_is_packed(L.sw1, L.sw3, L.sw2);
    if (shared_packed) parts.push_back({L.sw1, L.sw3, L.sw2, xq.rows.data(), M, shared});
    swiglu_packed(m, parts.data(), (int)parts.size());
    if (L.has_shared && !shared_packed) swiglu_ffn(m, L.sw1, L.sw3, L.sw2, x, M, shared);
    for (size_t r = 0; r < order.size(); r++) {
        memcpy(y_slots + order[r] * C, y_sorted.data() + r * C, (size_t)C * sizeof(float));
    }
}

void moe_route(const Config &c, const Layer &L, const float *logits, int64_t M, int32_t *idx,
               float *wts, uint8_t *keep) {
    const int64_t E = c.n_experts, K = c.top_k;
    thread_local std::vector<float> probs, scores;
    probs.resize((size_t)E);
    scores.resize((size_t)E);
    for (int64_t n = 0; n < M; n++) {
        const float *lg = logits + n * E;
        float mx = -INFINITY;
        for (int64_t e = 0; e < E; e++) {
            probs[(size_t)e] = lg[e] / (float)c.router_temperature;
            mx = fmaxf(mx, probs[(size_t)e]);
        }
        double sum = 0.0;
        for (int64_t e = 0; e < E; e++) {
            probs[(size_t)e] = expf(probs[(size_t)e] - mx);
            sum += probs[(size_t)e];
        }
        for (int64_t e = 0; e < E; e++) {
            probs[(size_t)e] = (float)(probs[(size_t)e] / sum);
            scores[(size_t)e] = probs[(size_t)e] + L.expert_bias[e];
        }
        float wsum = 0.0f;
        for (int64_t j = 0; j < K; j++) { /* k rounds of argmax; lowest index wins ties */
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                if (scores[(size_t)e] == -INFINITY) continue;
                if (best < 0 || scores[(size_t)e] > scores[(size_t)best]) best = e;
            }
            if (best < 0) best = 0; /* all scores -inf cannot happen with finite logits */
            scores[(size_t)best] = -INFINITY;
            idx[n * K + j] = (int32_t)best;
            wts[n * K + j] = probs[(size_t)best];
            wsum += probs[(size_t)best];
        }
        if (c.norm_topk) {
            for (int64_t j = 0; j < K; j++) wts[n * K + j] /= wsum;
        }
    }

    for (int64_t s = 0; s < M * K; s++) keep[s] = 1;
    if (c.has_capacity) {
        double raw = c.capacity_factor * (double)M * (double)K / (double)E;
        int64_t cap = (int64_t)ceil(nearbyint(raw * 1e6) / 1e6);
        std::vector<int64_t> used((size_t)E, 0);
        for (int64_t j = 0; j < K; j++) {
            for (int64_t n = 0; n < M; n++) {
                int32_t e = idx[n * K + j];
                keep[n * K + j] = used[(size_t)e] < cap;
                used[(size_t)e]++;
            }
        }
    }
}

void moe_ffn(ats_model *m, const Layer &L, const float *x, int64_t M, float *y) {
    const Config &c = m->cfg;
    const int64_t E = c.n_experts, K = c.top_k, C = c.dim;
    /* scratch reused across calls (no heap traffic per decode step once warm) */
    thread_local std::vector<float> logits, wts;
    thread_local std::vector<int32_t> idx;
    thread_local std::vector<uint8_t> keep;
    logits.resize((size_t)(M * E));
    Weight router;
    router.rows = E;
    router.cols = C;
    router.f32 = L.router;
    matmul(m->pool.get(), m->kernels, router, x, M, logits.data());

    idx.resize((size_t)(M * K));
    wts.resize((size_t)(M * K));
    keep.resize((size_t)(M * K));
    moe_route(c, L, logits.data(), M, idx.data(), wts.data(), keep.data());

    /* per-slot expert outputs (M*K, C), combined afterwards in choice order like ats-model */
    thread_local std::vector<float> y_slots, shared;
    y_slots.resize((size_t)(M * K * C));
    shared.resize(L.has_shared ? (size_t)(M * C) : 0);
    if (swiglu_is_packed(L.ew1, L.ew3, L.ew2)) {
        experts_packed(m, L, x, M, idx.data(), keep.data(), y_slots.data(), shared.data());
    } else {
        experts_dense(m, L, x, M, idx.data(), keep.data(), y_slots.data(), shared.data());
    }
    for (int64_t n = 0; n < M; n++) {
        float *yn = y + n * C;
        for (int64_t i = 0; i < C; i++) yn[i] = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            if (!keep[(size_t)(n * K + j)]) continue; /* a dropped slot adds nothing */
            const float *ys = y_slots.data() + (n * K + j) * C;
            float w = wts[(size_t)(n * K + j)];
            for (int64_t i = 0; i < C; i++) yn[i] += ys[i] * w;
        }
    }
    if (L.has_shared) {
        for (int64_t i = 0; i < M * C; i++) y[i] += shared[(size_t)i];
    }
}

}  // namespace ats
