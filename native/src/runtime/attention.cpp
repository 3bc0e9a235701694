/* Grouped-query causal attention over the KV cache, with RoPE (half-split, HF rotate_half).
 *
 *     q heads:  0 1 | 2 3 | 4 5 | 6 7        n_head = 8, n_kv_head = 4, group g = 2
 *     kv heads:  0  |  1  |  2  |  3         kv head j serves q heads j*g .. j*g+g-1 (HF repeat_kv)
 *
 * A query at slot p of sequence b sees the slots <= p of b that this layer holds a key for
 * (valid), which for MoD layers leaves out tokens the layer skipped. */
#include <math.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "forward.h"

namespace ats {

/* x (hd) rotated in place by the tables of one position: x*cos + rotate_half(x)*sin */
static void rope_row(float *x, const float *cos, const float *sin, int64_t hd) {
    int64_t half = hd / 2;
    float tmp[2048];
    float *r = hd <= 2048 ? tmp : new float[hd];
    for (int64_t i = 0; i < half; i++) {
        r[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
        r[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
    memcpy(x, r, (size_t)hd * sizeof(float));
    if (r != tmp) delete[] r;
}

void attention(ats_session *s, int64_t layer, const Rows &rows, float *q, float *k, const float *v,
               float *out) {
    ats_model *m = s->model;
    const Config &c = m->cfg;
    const int64_t hd = c.head_dim, NH = c.n_head, NKV = c.n_kv_head, group = NH / NKV;
    const int64_t KV = NKV * hd, L = s->max_len;
    float *kc = s->k[(size_t)layer].data(), *vc = s->v[(size_t)layer].data();
    uint8_t *valid = s->valid[(size_t)layer].data();

    for (int64_t r = 0; r < rows.M; r++) {
        const float *cos = m->rope_cos.data() + rows.pos[r] * hd;
        const float *sin = m->rope_sin.data() + rows.pos[r] * hd;
        for (int64_t h = 0; h < NH; h++) rope_row(q + r * NH * hd + h * hd, cos, sin, hd);
        for (int64_t h = 0; h < NKV; h++) rope_row(k + r * KV + h * hd, cos, sin, hd);
        int64_t slot = (int64_t)rows.seq[r] * L + rows.pos[r];
        memcpy(kc + slot * KV, k + r * KV, (size_t)KV * sizeof(float));
        memcpy(vc + slot * KV, v + r * KV, (size_t)KV * sizeof(float));
        valid[slot] = 1;
    }

    /* one task per (row, kv head): the group's query heads share each key and value load, 4 keys
     * per dot_f32 call and 4 values per axpy call */
    const float scale = 1.0f / sqrtf((float)hd);
    const Kernels *kern = m->kernels;
    int64_t work = 0; /* multiply-adds: two per key and head dimension */
    for (int64_t r = 0; r < rows.M; r++) work += 2 * (rows.pos[r] + 1) * NH * hd;
    m->pool->run_sized((int)(rows.M * NKV), work, [&](int task) {
        int64_t r = task / NKV, kvh = task % NKV;
        int64_t base = (int64_t)rows.seq[r] * L, n_keys = rows.pos[r] + 1;
        thread_local std::vector<int64_t> keys; /* valid slots of this row's sequence */
        thread_local std::vector<float> scores; /* (4 query heads, keys) */
        keys.clear();
        for (int64_t t = 0; t < n_keys; t++) {
            if (valid[base + t]) keys.push_back(base + t);
        }
        const int64_t nk = (int64_t)keys.size();
        scores.resize((size_t)(4 * nk));
        for (int64_t g0 = 0; g0 < group; g0 += 4) {
            const int ng = (int)std::min<int64_t>(4, group - g0);
            const float *qv[4];
            for (int j = 0; j < ng; j++) qv[j] = q + r * NH * hd + (kvh * group + g0 + j) * hd;
            for (int64_t i = 0; i < nk; i += 4) {
                const int nw = (int)std::min<int64_t>(4, nk - i);
                const float *kr[4];
                for (int u = 0; u < nw; u++) kr[u] = kc + keys[(size_t)(i + u)] * KV + kvh * hd;
                float d[16];
                kern->dot_f32((int)hd, kr, nw, qv, ng, d);
                for (int u = 0; u < nw; u++) {
                    for (int j = 0; j < ng; j++) scores[(size_t)(j * nk + i + u)] = d[u * 4 + j] * scale;
                }
            }
            for (int j = 0; j < ng; j++) {
                float *sc = scores.data() + j * nk;
                float mx = -INFINITY;
                for (int64_t i = 0; i < nk; i++) mx = std::max(mx, sc[i]);
                double sum = 0.0;
                for (int64_t i = 0; i < nk; i++) {
                    sc[i] = expf(sc[i] - mx);
                    sum += sc[i];
                }
                float inv = (float)(1.0 / sum);
                float *o = out + r * NH * hd + (kvh * group + g0 + j) * hd;
                memset(o, 0, (size_t)hd * sizeof(float));
                for (int64_t i = 0; i < nk; i += 4) {
                    const int nv = (int)std::min<int64_t>(4, nk - i);
                    float a[4];
                    const float *vr[4];
                    for (int u = 0; u < nv; u++) {
                        a[u] = sc[i + u] * inv;
                        vr[u] = vc + keys[(size_t)(i + u)] * KV + kvh * hd;
                    }
                    kern->axpy((int)hd, nv, a, vr, o);
                }
            }
        }
    });
}

}  // namespace ats
