/* Cache-blocked, threaded matmul over the dot kernels. Threads split the output features; inside a
 * task, blocks of NB activation rows stay in L2 while a tile of weight rows is swept over them in
 * 4 x 4 register blocks (weight rows x activation rows). int4 activations are split once into even
 * and odd elements so the kernels read both nibble planes against contiguous vectors. */
#include "matmul.h"

#include <algorithm>
#include <vector>

namespace ats {

static const int64_t NB = 64; /* activation rows per block */

Weight weight_slice(const Weight &s, int64_t e) {
    Weight w = s;
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

void matmul(ThreadPool *pool, const Kernels *k, const Weight &w, const float *x, int64_t N,
            float *y) {
    if (N <= 0 || w.rows <= 0) return;
    const int64_t C = w.cols, O = w.rows;
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
