/* Row-wise pieces of a block: RMSNorm (Zhang & Sennrich 2019, HF LlamaRMSNorm order) and the
 * SwiGLU FFN (Shazeer 2020): w2(silu(w1 x) * w3 x), w1 = gate, w3 = up, w2 = down. On packed
 * int8/int4 weights the gate and up projections of every FFN of a call run as ONE pool job, and
 * so do the down projections; the norm and silu(gate) * up quantize each row in the task that
 * makes it (issue 7: each pool job costs a wake-up at decode and a fork/join at prefill). */
#include <math.h>

#include <algorithm>
#include <vector>

#include "forward.h"

namespace ats {

/* y (C) = rmsnorm(x) * weight for one row */
static void norm_row(const float *xr, const float *weight, int64_t C, double eps, float *y) {
    /* 8 partial double sums: one serial chain of double adds (4-cycle latency each) made the
     * norms a few % of a prefill at dim 1024; the order change is far below fp32 */
    double part[8] = {};
    int64_t i = 0;
    for (; i + 8 <= C; i += 8) {
        for (int j = 0; j < 8; j++) part[j] += (double)xr[i + j] * xr[i + j];
    }
    for (; i < C; i++) part[i % 8] += (double)xr[i] * xr[i];
    double ss = ((part[0] + part[1]) + (part[2] + part[3])) +
                ((part[4] + part[5]) + (part[6] + part[7]));
    float inv = (float)(1.0 / sqrt(ss / (double)C + eps));
    for (int64_t i = 0; i < C; i++) y[i] = (xr[i] * inv) * weight[i];
}

void rms_norm(ThreadPool *pool, const float *x, const float *weight, int64_t M, int64_t C,
              double eps, float *y) {
    pool->run_rows((int)M, M * C * 4, [&](int task) {
        const int64_t r = task;
        norm_row(x + r * C, weight, C, eps, y + r * C);
    });
}

void rms_norm_qact(ThreadPool *pool, const Kernels *k, const float *x, const float *a, float *h,
                   const float *weight, int64_t M, int64_t C, double eps, QActRows *q) {
    qact_resize(q, M, C);
    pool->run_rows((int)M, M * C * 12, [&](int task) {
        const int64_t r = task;
        thread_local std::vector<float> y;
        y.resize((size_t)C);
        const float *xr = x + r * C;
        if (a) {
            float *hr = h + r * C;
            for (int64_t i = 0; i < C; i++) hr[i] = xr[i] + a[r * C + i];
            xr = hr;
        }
        norm_row(xr, weight, C, eps, y.data());
        qact_row(k, y.data(), C, r, q);
    });
}

/* g[i] = silu(g[i]) * u[i] for i < n (the kernel set's silu_mul), spread over the pool */
static void silu_mul(ThreadPool *pool, const Kernels *k, float *g, const float *u, int64_t n) {
    const int64_t chunk = 4096;
    pool->run_sized((int)((n + chunk - 1) / chunk), n * 8, [&](int t) {
        int64_t i0 = t * chunk, len = std::min(n, i0 + chunk) - i0;
        k->silu_mul((int)len, g + i0, u + i0);
    });
}

bool swiglu_is_packed(const Weight &w1, const Weight &w3, const Weight &w2) {
    return w1.packed && w3.packed && w2.packed;
}

void swiglu_packed(ats_model *m, const SwiGLUPart *parts, int n_parts) {
    ThreadPool *pool = m->pool.get();
    const Kernels *k = m->kernels;
    /* scratch reused across calls (no heap traffic per decode step once warm) */
    thread_local std::vector<float> g, u;
    thread_local std::vector<QActRows> hq;
    thread_local std::vector<MatmulJob> jobs;
    thread_local std::vector<int64_t> offset;
    offset.assign((size_t)n_parts + 1, 0);
    for (int p = 0; p < n_parts; p++) {
        offset[(size_t)p + 1] = offset[(size_t)p] + parts[p].N * parts[p].w1.rows;
    }
    g.resize((size_t)offset[(size_t)n_parts]);
    u.resize((size_t)offset[(size_t)n_parts]);
    if (hq.size() < (size_t)n_parts) hq.resize((size_t)n_parts);
    jobs.clear();
    for (int p = 0; p < n_parts; p++) {
        const SwiGLUPart &s = parts[p];
        jobs.push_back({s.w1, s.x, s.N, g.data() + offset[(size_t)p]});
        jobs.push_back({s.w3, s.x, s.N, u.data() + offset[(size_t)p]});
    }
    matmul_jobs(pool, k, jobs.data(), (int)jobs.size());
    /* silu(g) * u and its quantization for the down projection, row by row in one pool job
     * (the row is still in L1 when it is quantized); tasks = (part, row) */
    thread_local std::vector<int64_t> first_task; /* part p owns tasks [first[p], first[p+1]) */
    first_task.assign((size_t)n_parts + 1, 0);
    for (int p = 0; p < n_parts; p++) {
        first_task[(size_t)p + 1] = first_task[(size_t)p] + parts[p].N;
        qact_resize(&hq[(size_t)p], parts[p].N, parts[p].w1.rows);
    }
    /* the pool's threads see their own thread_locals: the task reads the caller's through these */
    const int64_t *first = first_task.data(), *off = offset.data();
    float *g0 = g.data();
    const float *u0 = u.data();
    QActRows *hq0 = hq.data();
    pool->run_rows((int)first[n_parts], off[n_parts] * 12, [&](int t) {
        int p = 0;
        while (first[p + 1] <= t) p++;
        const int64_t F = parts[p].w1.rows, n = t - first[p];
        k->silu_mul((int)F, g0 + off[p] + n * F, u0 + off[p] + n * F);
        qact_row(k, g0 + off[p] + n * F, F, n, &hq0[p]);
    });
    jobs.clear();
    for (int p = 0; p < n_parts; p++) {
        const SwiGLUPart &s = parts[p];
        jobs.push_back({s.w2, hq[(size_t)p].rows.data(), s.N, s.y});
    }
    matmul_jobs(pool, k, jobs.data(), (int)jobs.size());
}

void swiglu_ffn(ats_model *m, const Weight &w1, const Weight &w3, const Weight &w2, const float *x,
                int64_t M, float *y) {
    if (swiglu_is_packed(w1, w3, w2)) {
        thread_local QActRows xq;
        qact_build(m->pool.get(), m->kernels, x, M, w1.cols, &xq);
        SwiGLUPart part{w1, w3, w2, xq.rows.data(), M, y};
        swiglu_packed(m, &part, 1);
        return;
    }
    int64_t F = w1.rows;
    std::vector<float> g((size_t)(M * F)), u((size_t)(M * F));
    matmul(m->pool.get(), m->kernels, w1, x, M, g.data());
    matmul(m->pool.get(), m->kernels, w3, x, M, u.data());
    silu_mul(m->pool.get(), m->kernels, g.data(), u.data(), M * F);
    matmul(m->pool.get(), m->kernels, w2, g.data(), M, y);
}

}  // namespace ats
