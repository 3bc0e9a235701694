/* Row-wise pieces of a block: RMSNorm (Zhang & Sennrich 2019, HF LlamaRMSNorm order) and the
 * SwiGLU FFN (Shazeer 2020): w2(silu(w1 x) * w3 x), w1 = gate, w3 = up, w2 = down. */
#include <math.h>

#include <vector>

#include "forward.h"

namespace ats {

void rms_norm(const float *x, const float *weight, int64_t M, int64_t C, double eps, float *y) {
    for (int64_t r = 0; r < M; r++) {
        const float *xr = x + r * C;
        double ss = 0.0;
        for (int64_t i = 0; i < C; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)C + eps));
        for (int64_t i = 0; i < C; i++) y[r * C + i] = (xr[i] * inv) * weight[i];
    }
}

void swiglu_ffn(ats_model *m, const Weight &w1, const Weight &w3, const Weight &w2, const float *x,
                int64_t M, float *y) {
    int64_t F = w1.rows;
    std::vector<float> g((size_t)(M * F)), u((size_t)(M * F));
    matmul(m->pool.get(), m->kernels, w1, x, M, g.data());
    matmul(m->pool.get(), m->kernels, w3, x, M, u.data());
    for (int64_t i = 0; i < M * F; i++) {
        float gi = g[(size_t)i];
        g[(size_t)i] = gi / (1.0f + expf(-gi)) * u[(size_t)i];
    }
    matmul(m->pool.get(), m->kernels, w2, g.data(), M, y);
}

}  // namespace ats
