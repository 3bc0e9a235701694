/* Load-time repacking of int8/int4 weights into the row-group layout of repack.h, one matrix (or
 * one expert of a stacked weight) at a time, spread over the model's thread pool. */
#include "repack.h"

#include <stdlib.h>
#include <string.h>

#include <new>

#include "model_impl.h"

namespace ats {

static const int64_t Q4_RECORD = 4 * 32 + 8 * 4; /* int4 bytes per row group and pair */
static const int64_t Q8_HEADER = 64;             /* int8 row-group header: 4 scales + padding */

int64_t packed_bytes(const Weight &w) {
    int64_t groups = (w.rows + 3) / 4, pairs = (w.cols / 32 + 1) / 2;
    if (w.type == WEIGHT_Q4) return groups * pairs * Q4_RECORD;
    return groups * (Q8_HEADER + pairs * 4 * 64);
}

/* Code of element e of a loaded int4 row (low nibble = even element). */
static int q4_code(const uint8_t *row, int64_t e) {
    return e % 2 == 0 ? row[e / 2] & 0x0F : row[e / 2] >> 4;
}

/* Row group g of one int4 matrix (codes q4, scales scale, as loaded) into out. */
static void pack_q4_group(const Weight &w, int64_t g, uint8_t *out) {
    const int64_t nb = w.cols / 32, pairs = (nb + 1) / 2, row_bytes = w.cols / 2;
    const int64_t n_groups = w.cols / w.group;
    for (int64_t p = 0; p < pairs; p++) {
        uint8_t *rec = out + p * Q4_RECORD;
        float scales[8] = {};
        for (int i = 0; i < 4; i++) {
            int64_t row = 4 * g + i;
            uint8_t *dst = rec + i * 32;
            memset(dst, 0x88, 32);
            if (row >= w.rows) continue;
            const uint8_t *src = w.q4 + row * row_bytes;
            bool two = 2 * p + 1 < nb;
            for (int j = 0; j < 32; j++) { /* byte j: element j of block 2p | of block 2p + 1 */
                int lo = q4_code(src, 64 * p + j), hi = two ? q4_code(src, 64 * p + 32 + j) : 8;
                dst[j] = (uint8_t)(lo | hi << 4);
            }
            for (int j = 0; j < 2; j++) {
                int64_t b = 2 * p + j;
                if (b < nb) scales[2 * i + j] = w.scale[row * n_groups + b * 32 / w.group];
            }
        }
        memcpy(rec + 4 * 32, scales, sizeof scales);
    }
}

/* Row group g of one int8 matrix into out. */
static void pack_q8_group(const Weight &w, int64_t g, uint8_t *out) {
    const int64_t pairs = (w.cols / 32 + 1) / 2;
    memset(out, 0, (size_t)(Q8_HEADER + pairs * 4 * 64));
    float scales[4] = {};
    for (int i = 0; i < 4; i++) {
        int64_t row = 4 * g + i;
        if (row >= w.rows) continue;
        scales[i] = w.scale[row];
        for (int64_t p = 0; p < pairs; p++) {
            int64_t begin = p * 64, end = begin + 64 < w.cols ? begin + 64 : w.cols;
            memcpy(out + Q8_HEADER + p * 256 + i * 64, w.q8 + row * w.cols + begin,
                   (size_t)(end - begin));
        }
    }
    memcpy(out, scales, sizeof scales);
}

void pack_matrix(ThreadPool *pool, const Weight &w, uint8_t *dst) {
    const int64_t groups = (w.rows + 3) / 4, group_bytes = packed_bytes(w) / groups;
    const int64_t per_task = 64; /* row groups */
    pool->run((int)((groups + per_task - 1) / per_task), [&](int task) {
        for (int64_t g = task * per_task; g < groups && g < (task + 1) * per_task; g++) {
            if (w.type == WEIGHT_Q4) pack_q4_group(w, g, dst + g * group_bytes);
            else pack_q8_group(w, g, dst + g * group_bytes);
        }
    });
}

/* Packs the n_stack matrices of w (one per expert, or 1) into owned memory; sets w->packed. */
static void repack_weight(ats_model *m, Weight *w, int64_t n_stack) {
    if ((w->type != WEIGHT_Q8 && w->type != WEIGHT_Q4) || w->cols % 32 != 0) return;
    const int64_t bytes = packed_bytes(*w);
    size_t total = (size_t)(bytes * n_stack);
    uint8_t *buf = (uint8_t *)aligned_alloc(64, (total + 63) / 64 * 64);
    if (!buf) throw std::bad_alloc();
    m->packed.emplace_back(buf);
    for (int64_t e = 0; e < n_stack; e++) pack_matrix(m->pool.get(), weight_slice(*w, e), buf + e * bytes);
    w->packed = buf;
    w->packed_stride = bytes;
}

void weights_repack(ats_model *m) {
    const Kernels *k = m->kernels;
    if (!k->dot_q8_packed || !k->dot_q4_packed) return;
    const Config &c = m->cfg;
    for (Layer &L : m->layers) {
        for (Weight *w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w1, &L.w2, &L.w3, &L.sw1, &L.sw2, &L.sw3}) {
            repack_weight(m, w, 1);
        }
        for (Weight *w : {&L.ew1, &L.ew2, &L.ew3}) repack_weight(m, w, c.has_moe ? c.n_experts : 1);
    }
    repack_weight(m, &m->output, 1);
}

}  // namespace ats
