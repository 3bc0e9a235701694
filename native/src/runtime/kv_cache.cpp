/* The KV cache behind ats_session: per layer, keys and values (n_seq, n_kv_head, max_len, hd),
 * float or half precision (the model's kv_cache; a kv head's keys consecutive: decode attention
 * streams them) and a validity byte per slot (a
 * MoD layer leaves the slots of tokens it skipped invalid, so later tokens never attend to keys
 * that were never computed). */
#include <string.h>

#include <algorithm>
#include <memory>
#include <new>

#include "ats/model.h"
#include "forward.h"

using namespace ats;

extern "C" {

ats_session *ats_session_init(ats_model *m, int32_t n_seq, int32_t max_len, char *err,
                              size_t err_cap) {
    if (n_seq < 1 || max_len < 1) {
        ats::set_err(err, err_cap, "a session needs n_seq >= 1 and max_len >= 1");
        return nullptr;
    }
    if (max_len > m->cfg.max_seq_len) {
        ats::set_err(err, err_cap, "a sequence of " + std::to_string(max_len) +
                                  " tokens exceeds max_seq_len = " + std::to_string(m->cfg.max_seq_len));
        return nullptr;
    }
    try {
        std::unique_ptr<ats_session> s(new ats_session());
        s->model = m;
        s->n_seq = n_seq;
        s->max_len = max_len;
        s->length.assign((size_t)n_seq, 0);
        if (m->cuda) {
            std::string msg;
            if (!cuda_session_init(s.get(), &s->cuda, &msg)) {
                ats::set_err(err, err_cap, msg);
                return nullptr;
            }
            return s.release();
        }
        /* zeroed here, which faults every page in now: a huge page faulted in mid-generation
         * can stall the step on the kernel's compaction (seconds on a loaded host) */
        const size_t slots = (size_t)n_seq * (size_t)max_len;
        const size_t kv = slots * (size_t)(m->cfg.n_kv_head * m->cfg.head_dim);
        const size_t n_layer = (size_t)m->cfg.n_layer;
        const size_t elem = m->kv_f16 ? sizeof(uint16_t) : sizeof(float);
        s->kv = huge_alloc(2 * n_layer * kv * elem);
        uint8_t *base = (uint8_t *)s->kv.get();
        memset(base, 0, 2 * n_layer * kv * elem);
        s->k.resize(n_layer);
        s->v.resize(n_layer);
        s->valid.resize(n_layer);
        for (size_t l = 0; l < n_layer; l++) {
            s->k[l] = base + (2 * l) * kv * elem;
            s->v[l] = base + (2 * l + 1) * kv * elem;
            s->valid[l].assign(slots, 0);
        }
        return s.release();
    } catch (const std::bad_alloc &) {
        ats::set_err(err, err_cap, "out of memory allocating the KV cache");
        return nullptr;
    }
}

void ats_session_free(ats_session *s) {
    if (!s) return;
    cuda_session_free(s->cuda);
    delete s;
}

int32_t ats_session_length(const ats_session *s, int32_t b) {
    return b >= 0 && b < s->n_seq ? s->length[(size_t)b] : -1;
}

int ats_session_reset(ats_session *s, int32_t b, char *err, size_t err_cap) {
    if (b < 0 || b >= s->n_seq) {
        ats::set_err(err, err_cap, "sequence " + std::to_string(b) + " is out of range [0, " +
                                       std::to_string(s->n_seq) + ")");
        return -1;
    }
    s->length[(size_t)b] = 0;
    if (s->cuda) {
        cuda_session_reset(s, b);
        return 0;
    }
    /* keys and values stay; a slot is read only while valid, and every valid flag is cleared */
    for (std::vector<uint8_t> &valid : s->valid) {
        std::fill(valid.begin() + (size_t)b * s->max_len, valid.begin() + (size_t)(b + 1) * s->max_len, 0);
    }
    return 0;
}

}  // extern "C"
