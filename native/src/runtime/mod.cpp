/* Mixture-of-Depths routing (Raposo et al. 2024, arXiv:2404.02258) as ats-model generates: a token
 * runs a routed block when the causal predictor says so (learned routing: w_out(silu(w_in x)) > 0,
 * its delta scaled by sigmoid(router(x))), or when the position rule keeps it (static: floor((p+1)c)
 * > floor(pc); random: a seeded LCG hash of the position < c; weight 1). See layers/mod.py. */
#include <math.h>

#include <vector>

#include "forward.h"

namespace ats {

/* position_hash of layers/mod.py: three LCG rounds mod 2^31, value in [0, 1). */
static double position_hash(int64_t p, int64_t seed) {
    const int64_t M31 = 2147483648LL;
    int64_t s = ((seed % M31) + M31) % M31;
    int64_t h = (p * 1103515245LL + 12345 + s * 2654435761LL) % M31;
    for (int i = 0; i < 3; i++) {
        h = (h * 1103515245LL + 12345) % M31;
        h = h ^ (h >> 13);
    }
    return (double)h / (double)M31;
}

/* torch.round(x, decimals=9) */
static double round9(double x) { return nearbyint(x * 1e9) / 1e9; }

void mod_route(ats_model *m, const Layer &L, const float *x, const Rows &rows, uint8_t *sel,
               float *weight) {
    const Config &c = m->cfg;
    const int64_t C = c.dim;
    if (c.mod_routing == "learned") {
        const int64_t P = c.mod_predictor_dim;
        Weight w_in;
        w_in.rows = P;
        w_in.cols = C;
        w_in.f32 = L.pred_in;
        std::vector<float> hidden((size_t)(rows.M * P));
        matmul(m->pool.get(), m->kernels, w_in, x, rows.M, hidden.data());
        for (int64_t r = 0; r < rows.M; r++) {
            float logit = 0.0f, pred = 0.0f;
            for (int64_t i = 0; i < C; i++) logit += L.mod_router[i] * x[r * C + i];
            for (int64_t j = 0; j < P; j++) {
                float h = hidden[(size_t)(r * P + j)];
                pred += L.pred_out[j] * (h / (1.0f + expf(-h)));
            }
            sel[r] = pred > 0.0f;
            weight[r] = 1.0f / (1.0f + expf(-logit));
        }
        return;
    }
    for (int64_t r = 0; r < rows.M; r++) {
        double p = (double)rows.pos[r];
        if (c.mod_routing == "static") {
            sel[r] = floor(round9((p + 1) * c.mod_capacity)) > floor(round9(p * c.mod_capacity));
        } else {
            sel[r] = position_hash(rows.pos[r], L.mod_seed) < c.mod_capacity;
        }
        weight[r] = 1.0f;
    }
}

}  // namespace ats
