/* Mixture-of-Experts FFN, as ats-model's MoEFFN in eval mode:
 *   probs = softmax(router(x) / temperature)                    (fp32)
 *   top-k experts by probs + expert_bias (DeepSeek-V3 aux-loss-free: bias picks, never weighs)
 *   weights = probs at the chosen experts, renormalized to sum 1 when norm_topk
 *   capacity_factor set: ceil(cf * N * k / E) slots per expert, 1st choices of all tokens served
 *   before any 2nd choice, earlier tokens first (GShard / Switch); a dropped slot adds nothing
 *   y = sum_j weights_j * expert_j(x) + shared(x)
 * Tokens are grouped per expert so each expert runs one batched SwiGLU over its rows. */
#include <math.h>
#include <string.h>

#include <vector>

#include "forward.h"

namespace ats {

void moe_ffn(ats_model *m, const Layer &L, const float *x, int64_t M, float *y) {
    const Config &c = m->cfg;
    const int64_t E = c.n_experts, K = c.top_k, C = c.dim;
    std::vector<float> logits((size_t)(M * E));
    Weight router;
    router.rows = E;
    router.cols = C;
    router.f32 = L.router;
    matmul(m->pool.get(), m->kernels, router, x, M, logits.data());

    std::vector<int32_t> idx((size_t)(M * K));
    std::vector<float> wts((size_t)(M * K));
    std::vector<float> probs((size_t)E), scores((size_t)E);
    for (int64_t n = 0; n < M; n++) {
        const float *lg = logits.data() + n * E;
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
            idx[(size_t)(n * K + j)] = (int32_t)best;
            wts[(size_t)(n * K + j)] = probs[(size_t)best];
            wsum += probs[(size_t)best];
        }
        if (c.norm_topk) {
            for (int64_t j = 0; j < K; j++) wts[(size_t)(n * K + j)] /= wsum;
        }
    }

    std::vector<uint8_t> keep((size_t)(M * K), 1);
    if (c.has_capacity) {
        double raw = c.capacity_factor * (double)M * (double)K / (double)E;
        int64_t cap = (int64_t)ceil(nearbyint(raw * 1e6) / 1e6);
        std::vector<int64_t> used((size_t)E, 0);
        for (int64_t j = 0; j < K; j++) {
            for (int64_t n = 0; n < M; n++) {
                int32_t e = idx[(size_t)(n * K + j)];
                keep[(size_t)(n * K + j)] = used[(size_t)e] < cap;
                used[(size_t)e]++;
            }
        }
    }

    /* per-slot expert outputs (M*K, C), combined afterwards in choice order like ats-model */
    std::vector<float> y_slots((size_t)(M * K * C), 0.0f);
    std::vector<float> xe, ye;
    std::vector<int64_t> slots;
    for (int64_t e = 0; e < E; e++) {
        slots.clear();
        for (int64_t s = 0; s < M * K; s++) {
            if (idx[(size_t)s] == e && keep[(size_t)s]) slots.push_back(s);
        }
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
            memcpy(y_slots.data() + slots[(size_t)r] * C, ye.data() + r * C, (size_t)C * sizeof(float));
        }
    }
    for (int64_t n = 0; n < M; n++) {
        float *yn = y + n * C;
        for (int64_t i = 0; i < C; i++) yn[i] = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            const float *ys = y_slots.data() + (n * K + j) * C;
            float w = wts[(size_t)(n * K + j)];
            for (int64_t i = 0; i < C; i++) yn[i] += ys[i] * w;
        }
    }
    if (L.has_shared) {
        std::vector<float> sh((size_t)(M * C));
        swiglu_ffn(m, L.sw1, L.sw3, L.sw2, x, M, sh.data());
        for (int64_t i = 0; i < M * C; i++) y[i] += sh[(size_t)i];
    }
}

}  // namespace ats
