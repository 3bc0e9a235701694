/* Cache-blocked, threaded matmul over the dot kernels. Threads split the output features.
 * int8/int4 weights repacked at load (repack.h; every ATS model shape on a kernel set with
 * integer dots) take the integer path: each activation row is quantized to int8 per 32-block
 * (QAct, kernels.h) and dotted with the weight codes in integers, as llama.cpp does (Q8_0
 * activations), so the weights are never dequantized. A task sweeps a tile of row groups (about
 * 64 KiB, in L2) over the activation rows, PACK_MAX_NX rows per kernel call. Other weights (fp32,
 * or int8 rows that are not whole 32-blocks) run blocks of NB activation rows against tiles of
 * weight rows in 4 x 4 register blocks; int4 activations are then split once into even and odd
 * elements so the kernels read both nibble planes against contiguous vectors. Prefill and decode
 * use the same kernels (a row's result does not depend on how many rows share the call). */
#include "matmul.h"

#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <vector>

#include "repack.h"

namespace ats {

static const int64_t NB = 64; /* activation rows per block (fp32-activation path) */

void qact_resize(QActRows *a, int64_t N, int64_t C) {
    const int64_t nb = C / 32;
    a->q.resize((size_t)(N * C));
    a->d.resize((size_t)(N * nb));
    a->sum.resize((size_t)(N * nb));
    a->start4.resize((size_t)(N * nb));
    a->rows.resize((size_t)N);
}

/* The sum of one block's 32 codes. On x86 (SSE2, every x86-64 CPU) psadbw adds the unsigned
 * bytes q + 128 (q xor 0x80) in two 8-byte halves: ~10 instructions against ~50 for the widening
 * adds the compiler makes of the plain loop; the sum is exact either way. */
static inline int32_t block_sum(const int8_t *q) {
#if defined(__SSE2__)
    const __m128i flip = _mm_set1_epi8((char)0x80);
    const __m128i lo = _mm_xor_si128(_mm_loadu_si128((const __m128i *)q), flip);
    const __m128i hi = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(q + 16)), flip);
    const __m128i s = _mm_add_epi64(_mm_sad_epu8(lo, _mm_setzero_si128()),
                                    _mm_sad_epu8(hi, _mm_setzero_si128()));
    return _mm_cvtsi128_si32(_mm_add_epi64(s, _mm_unpackhi_epi64(s, s))) - 32 * 128;
#else
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += q[j];
    return s;
#endif
}

void qact_row(const Kernels *k, const float *x, int64_t C, int64_t n, QActRows *a) {
    const int64_t nb = C / 32;
    int8_t *q = a->q.data() + n * C;
    float *d = a->d.data() + n * nb;
    int32_t *sum = a->sum.data() + n * nb;
    int32_t *start4 = a->start4.data() + n * nb;
    k->quantize_q8_0((int)nb, x, q, d);
    for (int64_t b = 0; b < nb; b++) sum[b] = block_sum(q + b * 32);
    for (int64_t b = 0; b < nb; b++) start4[b] = -8 * sum[b];
    a->rows[(size_t)n] = {q, d, sum, start4};
}

void qact_build(ThreadPool *pool, const Kernels *k, const float *x, int64_t N, int64_t C,
                QActRows *a) {
    qact_resize(a, N, C);
    pool->run_rows((int)N, N * C * 8, [&](int n) { qact_row(k, x + (int64_t)n * C, C, n, a); });
}

Weight weight_slice(const Weight &s, int64_t e) {
    Weight w = s;
    if (s.packed) w.packed = s.packed + e * s.packed_stride;
    int64_t n = s.rows * s.cols;
    if (s.type == WEIGHT_F32) w.f32 = s.f32 + e * n;
    if (s.type == WEIGHT_Q8) {
        w.q8 = s.q8 + e * n;
        w.scale = s.scale + e * s.rows;
    }
    if (s.type == WEIGHT_Q4) {
        w.q4 = s.q4 + e * n / 2;
        w.scale = s.scale + e * s.rows * (s.cols / s.group);
    }
    return w;
}

/* The dot products of weight rows o[0..nw) with activation rows xr[0..nx) (both padded to 1 or 4
 * by repeating a row) into out[i * 4 + r]. */
static void block_dots(const Kernels *k, const Weight &w, const int64_t *o, int nw,
                       const float *const *xr, const float *const *xe, const float *const *xo,
                       int nx, float *out) {
    int n = (int)w.cols;
    if (w.type == WEIGHT_F32) {
        const float *rows[4];
        for (int i = 0; i < nw; i++) rows[i] = w.f32 + o[i] * w.cols;
        k->dot_f32(n, rows, nw, xr, nx, out);
    } else if (w.type == WEIGHT_Q8) {
        const int8_t *rows[4];
        float scale[4];
        for (int i = 0; i < nw; i++) {
            rows[i] = w.q8 + o[i] * w.cols;
            scale[i] = w.scale[o[i]];
        }
        k->dot_q8(n, rows, scale, nw, xr, nx, out);
    } else {
        const uint8_t *rows[4];
        const float *scale[4];
        for (int i = 0; i < nw; i++) {
            rows[i] = w.q4 + o[i] * (w.cols / 2);
            scale[i] = w.scale + o[i] * (w.cols / w.group);
        }
        k->dot_q4(n, w.group, rows, scale, nw, xe, xo, nx, out);
    }
}

/* One task of matmul_jobs: row groups [g_begin, g_end) of one job. */
struct PackedTask {
    int job;
    int64_t g_begin, g_end;
};

/* Row groups [g_begin, g_end) of job j: a tile of row groups (about 64 KiB) is swept over all
 * activation rows, PACK_MAX_NX at a time. Over several sweeps (prefill) the next tile is
 * prefetched into L2 meanwhile, a share per sweep: the first sweep of a tile otherwise waited on
 * DRAM (the weights are read from memory once per forward) and ran the matmuls at ~86% of the
 * kernel's in-cache rate. */
static void packed_task(const Kernels *k, const MatmulJob &j, int64_t g_begin, int64_t g_end) {
    const Weight &w = j.w;
    const int64_t O = w.rows, group_bytes = packed_group_bytes(w);
    const int n_blocks = (int)(w.cols / 32);
    const int64_t tile = std::max<int64_t>(1, (64 * 1024) / group_bytes);
    const int64_t sweeps = (j.N + PACK_MAX_NX - 1) / PACK_MAX_NX;
    auto dot = w.type == WEIGHT_Q4 ? k->dot_q4_packed : k->dot_q8_packed;
    for (int64_t t0 = g_begin; t0 < g_end; t0 += tile) {
        int64_t t1 = std::min(g_end, t0 + tile);
        const uint8_t *next = w.packed + t1 * group_bytes;
        const int64_t next_bytes = (std::min(g_end, t1 + tile) - t1) * group_bytes;
        for (int64_t n = 0, sweep = 0; n < j.N; n += PACK_MAX_NX, sweep++) {
            if (sweeps > 1) {
                const int64_t lo = next_bytes * sweep / sweeps;
                const int64_t hi = next_bytes * (sweep + 1) / sweeps;
                for (int64_t b = lo / 64 * 64; b < hi; b += 64) __builtin_prefetch(next + b, 0, 2);
            }
            int nx = (int)std::min<int64_t>(PACK_MAX_NX, j.N - n);
            const QAct *qa[PACK_MAX_NX];
            for (int r = 0; r < nx; r++) qa[r] = &j.x[n + r];
            for (int64_t g = t0; g < t1; g++) {
                float *dst = j.y + n * O + PACK_ROWS * g;
                int nw = (int)std::min<int64_t>(PACK_ROWS, O - PACK_ROWS * g);
                if (nw == PACK_ROWS) { /* a whole group: straight into y */
                    dot(n_blocks, w.packed + g * group_bytes, qa, nx, dst, O);
                    continue;
                }
                float out[PACK_MAX_NX * PACK_ROWS];
                dot(n_blocks, w.packed + g * group_bytes, qa, nx, out, PACK_ROWS);
                for (int r = 0; r < nx; r++) {
                    for (int i = 0; i < nw; i++) dst[r * O + i] = out[r * PACK_ROWS + i];
                }
            }
        }
    }
}

void matmul_jobs(ThreadPool *pool, const Kernels *k, const MatmulJob *jobs, int n_jobs) {
    /* about 4 tasks per thread over all jobs, by weight bytes; each job split evenly */
    int64_t total = 0, work = 0;
    for (int i = 0; i < n_jobs; i++) {
        total += packed_bytes(jobs[i].w);
        work += jobs[i].N * jobs[i].w.rows * jobs[i].w.cols;
    }
    const int64_t target = std::max<int64_t>(1, total / (pool->size() * 4));
    thread_local std::vector<PackedTask> tasks;
    tasks.clear();
    for (int i = 0; i < n_jobs; i++) {
        if (jobs[i].N <= 0) continue;
        const int64_t groups = (jobs[i].w.rows + PACK_ROWS - 1) / PACK_ROWS;
        int64_t parts = std::min(groups, std::max<int64_t>(1, packed_bytes(jobs[i].w) / target));
        for (int64_t p = 0; p < parts; p++) {
            tasks.push_back({i, groups * p / parts, groups * (p + 1) / parts});
        }
    }
    const std::vector<PackedTask> &ts = tasks;
    pool->run_sized((int)ts.size(), work, [&](int t) {
        packed_task(k, jobs[ts[(size_t)t].job], ts[(size_t)t].g_begin, ts[(size_t)t].g_end);
    });
}

void matmul_same_x(ThreadPool *pool, const Kernels *k, const Weight *const *w, int n,
                   const float *x, int64_t N, float *const *y) {
    bool packed = N > 0;
    for (int i = 0; i < n; i++) packed = packed && w[i]->packed;
    if (!packed) {
        for (int i = 0; i < n; i++) matmul(pool, k, *w[i], x, N, y[i]);
        return;
    }
    thread_local QActRows qact;
    thread_local std::vector<MatmulJob> jobs;
    qact_build(pool, k, x, N, w[0]->cols, &qact);
    jobs.clear();
    for (int i = 0; i < n; i++) jobs.push_back({*w[i], qact.rows.data(), N, y[i]});
    matmul_jobs(pool, k, jobs.data(), n);
}

void matmul(ThreadPool *pool, const Kernels *k, const Weight &w, const float *x, int64_t N,
            float *y) {
    if (N <= 0 || w.rows <= 0) return;
    const int64_t C = w.cols, O = w.rows;
    if (w.packed) {
        thread_local QActRows qact;
        qact_build(pool, k, x, N, C, &qact);
        MatmulJob job{w, qact.rows.data(), N, y};
        matmul_jobs(pool, k, &job, 1);
        return;
    }
    std::vector<float> split;
    if (w.type == WEIGHT_Q4) {
        split.resize((size_t)(N * C)); /* per row: C/2 even elements then C/2 odd elements */
        for (int64_t n = 0; n < N; n++) {
            const float *src = x + n * C;
            float *dst = split.data() + n * C;
            for (int64_t i = 0; i < C / 2; i++) {
                dst[i] = src[2 * i];
                dst[C / 2 + i] = src[2 * i + 1];
            }
        }
    }
    /* weight rows per tile: about 64 KiB of weights, at least 4 */
    int64_t row_bytes = w.type == WEIGHT_F32 ? C * 4 : (w.type == WEIGHT_Q8 ? C : C / 2);
    int64_t tile = std::max<int64_t>(4, (64 * 1024) / std::max<int64_t>(1, row_bytes)) / 4 * 4;
    int n_threads = pool->size();
    /* tasks: several per thread for balance, never thinner than 4 rows */
    int64_t per_task = std::max<int64_t>(4, (O + n_threads * 4 - 1) / (n_threads * 4));
    per_task = (per_task + 3) / 4 * 4;
    int n_tasks = (int)((O + per_task - 1) / per_task);
    pool->run_sized(n_tasks, N * O * C, [&](int task) {
        int64_t o_begin = task * per_task, o_end = std::min(O, o_begin + per_task);
        for (int64_t nb = 0; nb < N; nb += NB) {
            int64_t nb_end = std::min(N, nb + NB);
            for (int64_t t0 = o_begin; t0 < o_end; t0 += tile) {
                int64_t t1 = std::min(o_end, t0 + tile);
                for (int64_t n = nb; n < nb_end; n += 4) {
                    int nx = (int)std::min<int64_t>(4, nb_end - n);
                    const float *xr[4] = {}, *xe[4] = {}, *xo[4] = {};
                    for (int r = 0; r < 4; r++) {
                        int64_t row = n + (r < nx ? r : 0); /* pad 2-3 rows to 4 with row 0 */
                        xr[r] = x + row * C;
                        if (w.type == WEIGHT_Q4) {
                            xe[r] = split.data() + row * C;
                            xo[r] = xe[r] + C / 2;
                        }
                    }
                    int kx = nx > 1 ? 4 : 1;
                    for (int64_t o = t0; o < t1; o += 4) {
                        int nw = (int)std::min<int64_t>(4, t1 - o);
                        int64_t rows[4];
                        for (int i = 0; i < 4; i++) rows[i] = o + (i < nw ? i : 0);
                        int kw = nw > 1 ? 4 : 1;
                        float out[16];
                        block_dots(k, w, rows, kw, xr, xe, xo, kx, out);
                        for (int i = 0; i < nw; i++) {
                            for (int r = 0; r < nx; r++) y[(n + r) * O + o + i] = out[i * 4 + r];
                        }
                    }
                }
            }
        }
    });
}

}  // namespace ats
