/* Grouped-query causal attention over the KV cache, with RoPE (half-split, HF rotate_half).
 *
 *     q heads:  0 1 | 2 3 | 4 5 | 6 7        n_head = 8, n_kv_head = 4, group g = 2
 *     kv heads:  0  |  1  |  2  |  3         kv head j serves q heads j*g .. j*g+g-1 (HF repeat_kv)
 *
 * A query at slot p of sequence b sees the slots <= p of b that this layer holds a key for
 * (valid), which for MoD layers leaves out tokens the layer skipped. Tasks are (kv head, run of
 * up to RUN_ROWS consecutive rows of one sequence). A run of several rows (prefill) copies its
 * keys once into a transposed (hd, keys) buffer so the scores of 16 keys fill one vector
 * (vecmat: no horizontal sums, which with head_dim 64 cost more than the multiply-adds of a
 * per-key dot); a single row (decode) dots 4 keys at a time in place and sums the values, read
 * in place, by the same vecmat. An f16 cache (the model's kv_cache) halves the bytes decode
 * streams: its keys and values are converted to fp32 as they are loaded (dot_f16, vecmat_f16),
 * and a prefill run converts the ones it gathers (rows_f32). */
#include <math.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "forward.h"

namespace ats {

/* rows per attention task; runs at least TRANSPOSE_MIN rows long take the transposed-key path.
 * Each run transposes all the keys it sees, so a prompt of M rows transposes ~M^2 / (2 RUN_ROWS)
 * keys: 64-row runs halve that against 32 and still give each of 2 threads 8 tasks a layer at a
 * 128-token prompt (8 kv heads) */
static const int64_t RUN_ROWS = 64, TRANSPOSE_MIN = 4;

/* x (hd) rotated in place by the tables of one position: x*cos + rotate_half(x)*sin (each pair
 * x[i], x[i + half] read before either is written: no copy of the row) */
static void rope_row(float *x, const float *cos, const float *sin, int64_t hd) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos[i] + (-b) * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* What one task needs of the layer. */
struct AttnCtx {
    const Kernels *kern;
    const float *q;
    float *out;
    int64_t hd, NH, group;
    float scale;
    bool f16; /* the cache holds half precision (the model's kv_cache "f16") */
};

/* One task's keys and values: kv head kvh of one sequence, (max_len, hd) each in the cache
 * (kv_cache.cpp: a head's keys are consecutive rows, so reading a sequence's keys streams
 * memory instead of touching hd floats every n_kv_head * hd), float or half precision, and the
 * positions attended to. */
struct HeadKV {
    const void *k, *v;
    int64_t kvh;
    const int64_t *pos; /* valid positions, ascending */
    int64_t n;
};

/* The rows at positions pos[0..n) of one head's keys or values as an fp32 (n, hd) matrix: read
 * in place when the cache is f32 and the positions consecutive (every layer but a MoD one), else
 * gathered into buf (converted from half precision by the set's f16_to_f32, or copied). A
 * prefill run takes its keys and values this way; decode reads an f16 cache in place. */
static const float *rows_f32(const AttnCtx &c, const void *cache, const int64_t *pos, int64_t n,
                             std::vector<float> &buf) {
    const int64_t hd = c.hd;
    if (!c.f16 && pos[n - 1] - pos[0] == n - 1) return (const float *)cache + pos[0] * hd;
    buf.resize((size_t)(n * hd));
    for (int64_t i = 0; i < n; i++) {
        if (c.f16) {
            c.kern->f16_to_f32((int)hd, (const uint16_t *)cache + pos[i] * hd, buf.data() + i * hd);
        } else {
            memcpy(buf.data() + i * hd, (const float *)cache + pos[i] * hd,
                   (size_t)hd * sizeof(float));
        }
    }
    return buf.data();
}

/* o[j] = sum_i p[j][i] v(pos[i]) for the R (<= 4) query heads of one kv head, by vecmat: each
 * value vector loaded serves the R heads, and R x hd / 16 independent FMA chains run side by
 * side. Consecutive positions (every layer but a MoD one) are read in place, an f16 cache by
 * vecmat_f16 (the same sums as vecmat on the converted values); a MoD layer's are gathered. */
static void values(const AttnCtx &c, const HeadKV &h, int64_t nk, float *const *p, int R,
                   float *const *o) {
    thread_local std::vector<float> buf;
    const int64_t hd = c.hd;
    if (c.f16 && h.pos[nk - 1] - h.pos[0] == nk - 1) {
        c.kern->vecmat_f16((int)hd, (int)nk, p, R, (const uint16_t *)h.v + h.pos[0] * hd, hd, o);
        return;
    }
    c.kern->vecmat((int)hd, (int)nk, p, R, rows_f32(c, h.v, h.pos, nk, buf), hd, o);
}

/* One row against its first nk keys in place: the group's query heads (up to 4 at a time) share
 * each key load, 4 keys per dot_f32 (f16 cache: dot_f16) call; then the set's softmax and the
 * values. */
static void attend_row(const AttnCtx &c, int64_t r, const HeadKV &h, int64_t nk) {
    thread_local std::vector<float> scores; /* (4 query heads, keys) */
    const int64_t hd = c.hd;
    scores.resize((size_t)(4 * nk));
    for (int64_t g0 = 0; g0 < c.group; g0 += 4) {
        const int ng = (int)std::min<int64_t>(4, c.group - g0);
        const float *qv[4];
        float *pv[4], *ov[4];
        for (int j = 0; j < ng; j++) {
            const int64_t head = h.kvh * c.group + g0 + j;
            qv[j] = c.q + r * c.NH * hd + head * hd;
            ov[j] = c.out + r * c.NH * hd + head * hd;
            pv[j] = scores.data() + j * nk;
        }
        for (int64_t i = 0; i < nk; i += 4) {
            const int nw = (int)std::min<int64_t>(4, nk - i);
            float d[16];
            if (c.f16) {
                const uint16_t *kr[4];
                for (int u = 0; u < nw; u++) kr[u] = (const uint16_t *)h.k + h.pos[i + u] * hd;
                c.kern->dot_f16((int)hd, kr, nw, qv, ng, d);
            } else {
                const float *kr[4];
                for (int u = 0; u < nw; u++) kr[u] = (const float *)h.k + h.pos[i + u] * hd;
                c.kern->dot_f32((int)hd, kr, nw, qv, ng, d);
            }
            for (int u = 0; u < nw; u++) {
                for (int j = 0; j < ng; j++) pv[j][i + u] = d[u * 4 + j];
            }
        }
        for (int j = 0; j < ng; j++) c.kern->softmax((int)nk, c.scale, pv[j]);
        values(c, h, nk, pv, ng, ov);
    }
}

/* Rows r0..r1 of one sequence against the keys of kv head h: the keys (ascending positions) are
 * copied once into kt (hd, nk), transposed; the values (nk, hd) are read in place from the cache
 * (gathered into vr when a MoD layer left positions out or the cache holds half precision:
 * rows_f32). Row r sees the first n_r keys
 * (positions <= its own): scores = q kt[:, :n_r] and out = p v[:n_r], both vecmat (whole vectors
 * of keys or of head dimensions, no horizontal sums). The query vectors (row, head of the group)
 * go VECMAT_MAX_ROWS at a time, so each key or value vector loaded serves all of them: the
 * block's scores run to its largest n, and each row's probabilities past its own n_r are zero
 * (fma(0, v, acc) = acc), so a row's result is the one it gets alone. */
static void attend_run(const AttnCtx &c, const Rows &rows, int64_t r0, int64_t r1,
                       const HeadKV &h) {
    thread_local std::vector<float> kt, kr, vr, sc;
    thread_local std::vector<const float *> kptr;
    const int64_t hd = c.hd, nk = h.n;
    kt.resize((size_t)(hd * nk));
    sc.resize((size_t)(VECMAT_MAX_ROWS * nk));
    /* the keys into kt (hd, nk) by the set's transpose (AVX-512: 16 x 16 tiles in registers; a
     * scalar copy of one key at a time stored its hd values to hd different lines) */
    const float *keys = rows_f32(c, h.k, h.pos, nk, kr);
    kptr.resize((size_t)nk);
    for (int64_t i = 0; i < nk; i++) kptr[(size_t)i] = keys + i * hd;
    c.kern->transpose((int)nk, (int)hd, kptr.data(), kt.data(), nk);
    const float *vals = rows_f32(c, h.v, h.pos, nk, vr);
    const int64_t n_vec = (r1 - r0) * c.group; /* query vectors: row-major, heads of the group */
    for (int64_t v0 = 0; v0 < n_vec; v0 += VECMAT_MAX_ROWS) {
        const int R = (int)std::min<int64_t>(VECMAT_MAX_ROWS, n_vec - v0);
        const float *qv[VECMAT_MAX_ROWS];
        float *ov[VECMAT_MAX_ROWS], *sv[VECMAT_MAX_ROWS];
        int64_t n[VECMAT_MAX_ROWS], n_max = 0;
        for (int j = 0; j < R; j++) {
            const int64_t r = r0 + (v0 + j) / c.group, head = h.kvh * c.group + (v0 + j) % c.group;
            qv[j] = c.q + r * c.NH * hd + head * hd;
            ov[j] = c.out + r * c.NH * hd + head * hd;
            sv[j] = sc.data() + j * nk;
            n[j] = std::upper_bound(h.pos, h.pos + nk, (int64_t)rows.pos[r]) - h.pos;
            n_max = std::max(n_max, n[j]);
        }
        c.kern->vecmat((int)n_max, (int)hd, qv, R, kt.data(), nk, sv);
        for (int j = 0; j < R; j++) {
            c.kern->softmax((int)n[j], c.scale, sv[j]);
            std::fill(sv[j] + n[j], sv[j] + n_max, 0.0f);
        }
        c.kern->vecmat((int)hd, (int)n_max, sv, R, vals, hd, ov);
    }
}

/* One attention task: kv head kvh for rows r0..r1 (one sequence). */
struct AttnTask {
    int64_t kvh, r0, r1;
};

void attention(ats_session *s, int64_t layer, const Rows &rows, float *q, float *k, const float *v,
               float *out) {
    ats_model *m = s->model;
    const Config &c = m->cfg;
    const int64_t hd = c.head_dim, NH = c.n_head, NKV = c.n_kv_head, group = NH / NKV;
    const int64_t KV = NKV * hd, L = s->max_len;
    const bool f16 = m->kv_f16;
    const size_t elem = f16 ? sizeof(uint16_t) : sizeof(float);
    uint8_t *kc = (uint8_t *)s->k[(size_t)layer], *vc = (uint8_t *)s->v[(size_t)layer];
    uint8_t *valid = s->valid[(size_t)layer].data();

    /* RoPE and the cache writes, rows spread over the pool (each row owns its slot) */
    m->pool->run_rows((int)rows.M, rows.M * (NH + NKV) * hd * 2, [&](int task) {
        const int64_t r = task;
        const float *cos = m->rope_cos.data() + rows.pos[r] * hd;
        const float *sin = m->rope_sin.data() + rows.pos[r] * hd;
        for (int64_t h = 0; h < NH; h++) rope_row(q + r * NH * hd + h * hd, cos, sin, hd);
        for (int64_t h = 0; h < NKV; h++) rope_row(k + r * KV + h * hd, cos, sin, hd);
        for (int64_t h = 0; h < NKV; h++) {
            const size_t at = (size_t)kv_offset(s, rows.seq[r], h, rows.pos[r]) * elem;
            if (f16) {
                m->kernels->f32_to_f16((int)hd, k + r * KV + h * hd, (uint16_t *)(kc + at));
                m->kernels->f32_to_f16((int)hd, v + r * KV + h * hd, (uint16_t *)(vc + at));
            } else {
                memcpy(kc + at, k + r * KV + h * hd, (size_t)hd * sizeof(float));
                memcpy(vc + at, v + r * KV + h * hd, (size_t)hd * sizeof(float));
            }
        }
        valid[(int64_t)rows.seq[r] * L + rows.pos[r]] = 1;
    });

    /* tasks: runs of consecutive rows of one sequence, at most RUN_ROWS each, per kv head; the
     * last runs of a prompt see the most keys, so the tasks go last run first (the pool hands
     * them out in order: the short ones at the end even out the threads) */
    thread_local std::vector<AttnTask> tasks;
    tasks.clear();
    for (int64_t r0 = 0; r0 < rows.M;) {
        int64_t r1 = r0 + 1;
        while (r1 < rows.M && r1 - r0 < RUN_ROWS && rows.seq[r1] == rows.seq[r0]) r1++;
        for (int64_t kvh = 0; kvh < NKV; kvh++) tasks.push_back({kvh, r0, r1});
        r0 = r1;
    }
    std::reverse(tasks.begin(), tasks.end());
    const AttnCtx ctx{m->kernels, q, out, hd, NH, group, 1.0f / sqrtf((float)hd), f16};
    int64_t work = 0; /* multiply-adds: two per key and head dimension */
    for (int64_t r = 0; r < rows.M; r++) work += 2 * (rows.pos[r] + 1) * NH * hd;
    const std::vector<AttnTask> &ts = tasks;
    m->pool->run_sized((int)ts.size(), work, [&](int task) {
        const AttnTask &t = ts[(size_t)task];
        const int32_t seq = rows.seq[t.r0];
        const uint8_t *seq_valid = valid + (int64_t)seq * L;
        int64_t max_pos = 0;
        for (int64_t r = t.r0; r < t.r1; r++) max_pos = std::max<int64_t>(max_pos, rows.pos[r]);
        thread_local std::vector<int64_t> pos; /* valid positions of the sequence, <= max_pos */
        pos.clear();
        for (int64_t p = 0; p <= max_pos; p++) {
            if (seq_valid[p]) pos.push_back(p);
        }
        const size_t head = (size_t)kv_offset(s, seq, t.kvh, 0) * elem;
        const HeadKV h{kc + head, vc + head, t.kvh, pos.data(), (int64_t)pos.size()};
        if (t.r1 - t.r0 >= TRANSPOSE_MIN) {
            attend_run(ctx, rows, t.r0, t.r1, h);
            return;
        }
        for (int64_t r = t.r0; r < t.r1; r++) {
            const int64_t n = std::upper_bound(pos.begin(), pos.end(), (int64_t)rows.pos[r]) -
                              pos.begin();
            attend_row(ctx, r, h, n);
        }
    });
}

}  // namespace ats
