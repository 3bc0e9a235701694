/* Load-time repacking of int8/int4 weights into the row-group layout of repack.h, one matrix (or
 * one expert of a stacked weight) at a time, spread over the model's thread pool, all into one
 * buffer backed by huge pages where the OS offers them. */
#include "repack.h"

#include <math.h>
#include <string.h>

#include <vector>

#include "model_impl.h"

namespace ats {

static const int64_t Q4_RECORD = 4 * 64 + PACK_ROWS * 2; /* int4 bytes per row group and block */
static const int64_t Q8_RECORD = 8 * 64;                 /* int8 bytes per row group and block */
static const int64_t Q8_HEADER = PACK_ROWS * 4;          /* int8 row-group header: row scales */

int64_t packed_group_bytes(const Weight &w) {
    const int64_t nb = w.cols / 32;
    return w.type == WEIGHT_Q4 ? nb * Q4_RECORD : Q8_HEADER + nb * Q8_RECORD;
}

int64_t packed_bytes(const Weight &w) {
    return (w.rows + PACK_ROWS - 1) / PACK_ROWS * packed_group_bytes(w);
}

bool pack_check(const Weight &w, std::string *err) {
    if (w.type != WEIGHT_Q4) return true;
    const int64_t n = w.rows * (w.cols / w.group);
    for (int64_t i = 0; i < n; i++) {
        if (!(fabsf(w.scale[i]) <= 65504.0f)) {
            *err = "int4 scale " + std::to_string(w.scale[i]) + " at index " + std::to_string(i) +
                   " is not a finite fp16 value (|scale| <= 65504): the packed copy stores int4 "
                   "scales in half precision";
            return false;
        }
    }
    return true;
}

/* Code of element e of a loaded int4 row (low nibble = even element). */
static int q4_code(const uint8_t *row, int64_t e) {
    return e % 2 == 0 ? row[e / 2] & 0x0F : row[e / 2] >> 4;
}

/* Row group g of one int4 matrix (codes q4, scales scale, as loaded) into out. */
static void pack_q4_group(const Weight &w, int64_t g, uint8_t *out) {
    const int64_t nb = w.cols / 32, row_bytes = w.cols / 2, n_groups = w.cols / w.group;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *rec = out + b * Q4_RECORD;
        uint16_t scales[PACK_ROWS];
        memset(rec, 0x88, 4 * 64); /* code 8: weight 0 */
        for (int L = 0; L < PACK_ROWS; L++) {
            int64_t row = PACK_ROWS * g + L;
            scales[L] = 0;
            if (row >= w.rows) continue;
            const uint8_t *src = w.q4 + row * row_bytes;
            for (int k = 0; k < 4; k++) {
                for (int m = 0; m < 4; m++) {
                    int64_t e = 32 * b + 4 * k + m;
                    rec[64 * k + 4 * L + m] = (uint8_t)(q4_code(src, e) | q4_code(src, e + 16) << 4);
                }
            }
            scales[L] = fp16_from_f32(w.scale[row * n_groups + b * 32 / w.group]);
        }
        memcpy(rec + 4 * 64, scales, sizeof scales);
    }
}

/* Row group g of one int8 matrix into out. */
static void pack_q8_group(const Weight &w, int64_t g, uint8_t *out) {
    const int64_t nb = w.cols / 32;
    float scales[PACK_ROWS] = {};
    memset(out + Q8_HEADER, 128, (size_t)(nb * Q8_RECORD)); /* u = 128: weight 0 */
    for (int L = 0; L < PACK_ROWS; L++) {
        int64_t row = PACK_ROWS * g + L;
        if (row >= w.rows) continue;
        scales[L] = w.scale[row];
        const int8_t *src = w.q8 + row * w.cols;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *rec = out + Q8_HEADER + b * Q8_RECORD;
            for (int k = 0; k < 8; k++) {
                for (int m = 0; m < 4; m++) {
                    rec[64 * k + 4 * L + m] = (uint8_t)(src[32 * b + 4 * k + m] + 128);
                }
            }
        }
    }
    memcpy(out, scales, sizeof scales);
}

void pack_matrix(ThreadPool *pool, const Weight &w, uint8_t *dst) {
    const int64_t groups = (w.rows + PACK_ROWS - 1) / PACK_ROWS, group_bytes = packed_group_bytes(w);
    const int64_t per_task = 16; /* row groups */
    pool->run((int)((groups + per_task - 1) / per_task), [&](int task) {
        for (int64_t g = task * per_task; g < groups && g < (task + 1) * per_task; g++) {
            if (w.type == WEIGHT_Q4) pack_q4_group(w, g, dst + g * group_bytes);
            else pack_q8_group(w, g, dst + g * group_bytes);
        }
    });
}

/* One weight to pack: n_stack matrices (one per expert, or 1) at offset in the packed buffer. */
struct PackItem {
    Weight *w;
    int64_t n_stack;
    size_t offset;
};

/* Adds w to the plan (and its size to *total) when it gets a packed copy; false with *err naming
 * the tensor when it cannot be packed (pack_check). */
static bool plan_weight(const Kernels *k, Weight *w, int64_t n_stack, const std::string &name,
                        std::vector<PackItem> *plan, size_t *total, std::string *err) {
    if (w->type == WEIGHT_Q8 && !k->dot_q8_packed) return true;
    if (w->type == WEIGHT_Q4 && !k->dot_q4_packed) return true;
    if ((w->type != WEIGHT_Q8 && w->type != WEIGHT_Q4) || w->cols % 32 != 0) return true;
    for (int64_t e = 0; e < n_stack; e++) {
        if (!pack_check(weight_slice(*w, e), err)) {
            *err = name + (n_stack > 1 ? " (expert " + std::to_string(e) + ")" : "") + ": " + *err;
            return false;
        }
    }
    plan->push_back({w, n_stack, *total});
    *total += (size_t)(packed_bytes(*w) * n_stack + 63) / 64 * 64;
    return true;
}

bool weights_repack(ats_model *m, std::string *err) {
    const Config &c = m->cfg;
    const Kernels *k = m->kernels;
    std::vector<PackItem> plan;
    size_t total = 0;
    for (size_t i = 0; i < m->layers.size(); i++) {
        Layer &L = m->layers[i];
        const std::string p = "layers." + std::to_string(i) + ".";
        const std::pair<Weight *, const char *> dense[] = {
            {&L.wq, "attn.wq.weight"},       {&L.wk, "attn.wk.weight"},
            {&L.wv, "attn.wv.weight"},       {&L.wo, "attn.wo.weight"},
            {&L.w1, "ffn.w1.weight"},        {&L.w2, "ffn.w2.weight"},
            {&L.w3, "ffn.w3.weight"},        {&L.sw1, "ffn.shared.w1.weight"},
            {&L.sw2, "ffn.shared.w2.weight"}, {&L.sw3, "ffn.shared.w3.weight"}};
        for (const auto &[w, name] : dense) {
            if (!plan_weight(k, w, 1, p + name, &plan, &total, err)) return false;
        }
        const std::pair<Weight *, const char *> experts[] = {
            {&L.ew1, "ffn.experts.w1"}, {&L.ew2, "ffn.experts.w2"}, {&L.ew3, "ffn.experts.w3"}};
        for (const auto &[w, name] : experts) {
            if (!plan_weight(k, w, c.has_moe ? c.n_experts : 1, p + name, &plan, &total, err)) {
                return false;
            }
        }
    }
    if (!plan_weight(k, &m->output, 1, "output.weight", &plan, &total, err)) return false;
    if (plan.empty()) return true;
    /* the packed copies share one buffer on huge pages (huge_pages.h: the matmuls stream every
     * weight once per forward) */
    m->packed.push_back(huge_alloc(total));
    uint8_t *buf = m->packed.back().get();
    for (const PackItem &item : plan) {
        Weight *w = item.w;
        const int64_t bytes = packed_bytes(*w);
        uint8_t *dst = buf + item.offset;
        for (int64_t e = 0; e < item.n_stack; e++) {
            pack_matrix(m->pool.get(), weight_slice(*w, e), dst + e * bytes);
        }
        w->packed = dst;
        w->packed_stride = bytes;
    }
    return true;
}

}  // namespace ats
