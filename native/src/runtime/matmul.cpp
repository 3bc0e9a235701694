/* Cache-blocked, threaded matmul over the dot kernels. Threads split the output features; inside a
 * task, blocks of NB activation rows stay in L2 while a tile of weight rows is swept over them in
 * 4 x 4 register blocks (weight rows x activation rows). int4 activations are split once into even
 * and odd elements so the kernels read both nibble planes against contiguous vectors.
 * int8/int4 weights take the integer path when the kernel set has one and the rows are whole
 * 32-blocks (every ATS model shape): each activation row is quantized to int8 per 32-block (QAct,
 * kernels.h) and dotted with the weight codes in integers, as llama.cpp does (Q8_0 activations),
 * so the weights are never dequantized. Prefill and decode use the same kernels (a row's result
 * does not depend on how many rows share the call). */
#include "matmul.h"

#include <math.h>

#include <algorithm>
#include <vector>

#include "repack.h"

namespace ats {

static const int64_t NB = 64; /* activation rows per block */

/* Storage behind the QAct rows of one matmul call. */
struct QActRows {
    std::vector<int8_t> q;
    std::vector<float> d, lane_d;
    std::vector<int32_t> lane_neg8;
    std::vector<QAct> rows;
};

/* Quantizes x (N, C), C % 32 == 0, into QAct rows (kernels.h) in natural or nibble-split code
 * order, with lane_neg8 for int4 weights; rows are spread over the pool. */
static void qact_build(ThreadPool *pool, const Kernels *k, const float *x, int64_t N, int64_t C,
                       bool nibble_split, bool int4, QActRows *a) {
    const int64_t nb = C / 32, np = (nb + 1) / 2; /* blocks, pairs of blocks (zero-padded) */
    a->q.assign((size_t)(N * np * 64), 0);
    a->d.assign((size_t)(N * np * 2), 0.0f);
    a->lane_d.assign((size_t)(N * np * 16), 0.0f);
    a->lane_neg8.assign(int4 ? (size_t)(N * np * 16) : 0, 0);
    a->rows.resize((size_t)N);
    pool->run_sized((int)N, N * C * 8, [&](int task) {
        int64_t n = task;
        int8_t *q = a->q.data() + n * np * 64;
        float *d = a->d.data() + n * np * 2;
        if (!nibble_split) {
            k->quantize_q8_0((int)nb, x + n * C, q, d);
        } else {
            std::vector<int8_t> natural((size_t)C);
            k->quantize_q8_0((int)nb, x + n * C, natural.data(), d);
            for (int64_t b = 0; b < nb; b++) {
                for (int j = 0; j < 32; j++) {
                    /* even elements of block b at pair + 16h, odd ones at pair + 32 + 16h */
                    q[(b / 2) * 64 + (j % 2) * 32 + (b % 2) * 16 + j / 2] = natural[(size_t)(b * 32 + j)];
                }
            }
        }
        float *lane_d = a->lane_d.data() + n * np * 16;
        int32_t *neg8 = int4 ? a->lane_neg8.data() + n * np * 16 : nullptr;
        for (int64_t p = 0; p < np; p++) {
            for (int L = 0; L < 16; L++) {
                /* natural: lanes 0-7 block 2p, 8-15 block 2p+1; split: blocks alternate every 4 */
                lane_d[p * 16 + L] = d[2 * p + (nibble_split ? (L >> 2) & 1 : L >> 3)];
                if (int4) {
                    const int8_t *c = q + p * 64 + L * 4;
                    neg8[p * 16 + L] = -8 * (c[0] + c[1] + c[2] + c[3]);
                }
            }
        }
        a->rows[(size_t)n] = {q, d, lane_d, neg8};
    });
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
                       const QAct *const *qa, int nx, float *out) {
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
        if (qa[0]) k->dot_q8_i8(n, rows, scale, nw, qa, nx, out);
        else k->dot_q8(n, rows, scale, nw, xr, nx, out);
    } else {
        const uint8_t *rows[4];
        const float *scale[4];
        for (int i = 0; i < nw; i++) {
            rows[i] = w.q4 + o[i] * (w.cols / 2);
            scale[i] = w.scale + o[i] * (w.cols / w.group);
        }
        if (qa[0]) k->dot_q4_i8(n, w.group, rows, scale, nw, qa, nx, out);
        else k->dot_q4(n, w.group, rows, scale, nw, xe, xo, nx, out);
    }
}

/* The integer path on weights repacked at load (repack.h): threads split the row groups; a tile
 * of row groups (about 64 KiB) is swept over blocks of 4 activation rows. */
static void matmul_packed(ThreadPool *pool, const Kernels *k, const Weight &w,
                          const QActRows &qact, int64_t N, float *y) {
    const int64_t O = w.rows, groups = (O + 3) / 4, pairs = (w.cols / 32 + 1) / 2;
    const int64_t group_bytes = packed_bytes(w) / groups;
    const int64_t tile = std::max<int64_t>(1, (64 * 1024) / group_bytes);
    auto dot = w.type == WEIGHT_Q4 ? k->dot_q4_packed : k->dot_q8_packed;
    int n_threads = pool->size();
    /* tasks: several per thread for balance */
    int64_t per_task = std::max<int64_t>(1, (groups + n_threads * 4 - 1) / (n_threads * 4));
    int n_tasks = (int)((groups + per_task - 1) / per_task);
    pool->run_sized(n_tasks, N * O * w.cols, [&](int task) {
        int64_t g_begin = task * per_task, g_end = std::min(groups, g_begin + per_task);
        for (int64_t t0 = g_begin; t0 < g_end; t0 += tile) {
            int64_t t1 = std::min(g_end, t0 + tile);
            for (int64_t n = 0; n < N; n += 4) {
                int nx = (int)std::min<int64_t>(4, N - n);
                const QAct *qa[4];
                for (int r = 0; r < 4; r++) qa[r] = &qact.rows[(size_t)(n + (r < nx ? r : 0))];
                for (int64_t g = t0; g < t1; g++) {
                    float out[16];
                    dot((int)pairs, w.packed + g * group_bytes, qa, nx > 1 ? 4 : 1, out);
                    int nw = (int)std::min<int64_t>(4, O - 4 * g);
                    for (int i = 0; i < nw; i++) {
                        for (int r = 0; r < nx; r++) y[(n + r) * O + 4 * g + i] = out[i * 4 + r];
                    }
                }
            }
        }
    });
}

void matmul(ThreadPool *pool, const Kernels *k, const Weight &w, const float *x, int64_t N,
            float *y) {
    if (N <= 0 || w.rows <= 0) return;
    const int64_t C = w.cols, O = w.rows;
    bool int_path = C % 32 == 0 &&
                    ((w.type == WEIGHT_Q8 && k->dot_q8_i8) || (w.type == WEIGHT_Q4 && k->dot_q4_i8));
    QActRows qact;
    bool int4 = w.type == WEIGHT_Q4;
    if (int_path) qact_build(pool, k, x, N, C, int4 && !w.packed, int4, &qact);
    if (int_path && w.packed) {
        matmul_packed(pool, k, w, qact, N, y);
        return;
    }
    std::vector<float> split;
    if (w.type == WEIGHT_Q4 && !int_path) {
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
                    const QAct *qa[4] = {};
                    for (int r = 0; r < 4; r++) {
                        int64_t row = n + (r < nx ? r : 0); /* pad 2-3 rows to 4 with row 0 */
                        xr[r] = x + row * C;
                        if (int_path) qa[r] = &qact.rows[(size_t)row];
                        else if (w.type == WEIGHT_Q4) {
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
                        block_dots(k, w, rows, kw, xr, xe, xo, qa, kx, out);
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
