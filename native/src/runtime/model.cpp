/* The C API of include/ats/model.h: model init/free (config, RoPE tables, weights, kernels,
 * threads), and the argument checks around the forward pass (sessions: kv_cache.cpp). Every entry
 * point catches C++ exceptions (allocation failure) and reports them through err. */
#include "ats/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <fstream>
#include <new>
#include <sstream>
#include <stdexcept>

#include "../threads.h"
#include "argmax.h"
#include "forward.h"
#include "repack.h"

namespace ats {

void set_err(char *err, size_t cap, const std::string &msg) {
    if (err && cap) snprintf(err, cap, "%s", msg.c_str());
}

/* (cos, sin) tables (max_seq_len, head_dim) as ats_kernels.rope_tables: float64, then cast. */
static void build_rope(const Config &c, std::vector<float> *cos_t, std::vector<float> *sin_t) {
    const int64_t hd = c.head_dim, half = hd / 2;
    std::vector<double> inv((size_t)half);
    for (int64_t i = 0; i < half; i++) {
        double f = 1.0 / pow(c.rope_theta, (double)(2 * i) / (double)hd);
        if (c.rope_scaling) { /* Llama 3.1 rope_type "llama3" */
            double old_len = c.rs_original_max_seq_len, lo = c.rs_low_freq_factor,
                   hi = c.rs_high_freq_factor;
            double wavelen = 2 * M_PI / f;
            double low_wl = old_len / lo, high_wl = old_len / hi;
            double smooth = (old_len / wavelen - lo) / (hi - lo);
            double blended = (1 - smooth) * f / c.rs_factor + smooth * f;
            double out = wavelen > low_wl ? f / c.rs_factor : f;
            f = (wavelen <= low_wl && wavelen >= high_wl) ? blended : out;
        }
        inv[(size_t)i] = f;
    }
    cos_t->resize((size_t)(c.max_seq_len * hd));
    sin_t->resize((size_t)(c.max_seq_len * hd));
    for (int64_t t = 0; t < c.max_seq_len; t++) {
        for (int64_t i = 0; i < hd; i++) {
            double angle = (double)t * inv[(size_t)(i % half)];
            (*cos_t)[(size_t)(t * hd + i)] = (float)cos(angle);
            (*sin_t)[(size_t)(t * hd + i)] = (float)sin(angle);
        }
    }
}

static ats_model *model_init(const ats_model_params *p, std::string *err) {
    if (!p || !p->path) {
        *err = "model path is missing";
        return nullptr;
    }
    std::string dir = p->path;
    const std::string device = p->device ? p->device : "cpu";
    if (device != "cpu" && device != "cuda") {
        *err = "unknown device '" + device + "' (expected 'cpu' or 'cuda')";
        return nullptr;
    }
    const std::string kv_cache = p->kv_cache ? p->kv_cache : "f32";
    if (kv_cache != "f32" && kv_cache != "f16") {
        *err = "unknown kv_cache '" + kv_cache + "' (expected 'f32' or 'f16')";
        return nullptr;
    }
    if (kv_cache == "f16" && device == "cuda") {
        *err = "kv_cache 'f16' is for the CPU: the CUDA backend keeps its KV cache in f32";
        return nullptr;
    }
    if (device == "cuda" && !cuda_built()) {
        CudaModel *none = nullptr;
        cuda_model_init(nullptr, &none, err); /* the message saying how to build with CUDA */
        return nullptr;
    }
    std::ifstream f(dir + "/config.json", std::ios::binary);
    if (!f) {
        *err = dir + ": no config.json";
        return nullptr;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    std::unique_ptr<ats_model> m(new ats_model());
    m->config_text = ss.str();
    if (!config_parse(m->config_text, &m->cfg, err)) return nullptr;
    m->kernels = kernels_by_name(p->kernels, err);
    if (!m->kernels) return nullptr;
    if (!weights_load(m.get(), dir, err)) {
        for (StFile &sf : m->files) st_close(&sf);
        return nullptr;
    }
    build_rope(m->cfg, &m->rope_cos, &m->rope_sin);
    int n = threads_resolve(p->n_threads, "threads", err);
    if (n < 0) return nullptr;
    try {
        m->pool.reset(new ThreadPool(n));
    } catch (const std::runtime_error &e) {
        *err = e.what();
        for (StFile &sf : m->files) st_close(&sf);
        return nullptr;
    }
    m->device = device;
    m->kv_f16 = kv_cache == "f16";
    /* the CPU's repacked copies serve the CPU kernels only; the GPU takes the loaded layout */
    bool ok = device == "cuda" ? cuda_model_init(m.get(), &m->cuda, err)
                               : weights_repack(m.get(), err);
    if (!ok) {
        for (StFile &sf : m->files) st_close(&sf);
        return nullptr;
    }
    return m.release();
}

int session_forward_tokens(ats_session *s, const int32_t *const *ids, const int32_t *n_new,
                           float *last_logits, float *all_logits, int32_t *last_tokens, char *err,
                           size_t err_cap) {
    const int64_t V = s->model->cfg.vocab_size;
    for (int32_t b = 0; b < s->n_seq; b++) {
        if (n_new[b] < 0) {
            set_err(err, err_cap, "negative token count");
            return -1;
        }
        if ((int64_t)s->length[(size_t)b] + n_new[b] > s->max_len) {
            set_err(err, err_cap, "sequence " + std::to_string(b) + " would hold " +
                                      std::to_string(s->length[(size_t)b] + n_new[b]) +
                                      " tokens, more than the session's " + std::to_string(s->max_len) +
                                      " (max_seq_len " + std::to_string(s->model->cfg.max_seq_len) + ")");
            return -1;
        }
        for (int32_t t = 0; t < n_new[b]; t++) {
            if (ids[b][t] < 0 || ids[b][t] >= V) {
                set_err(err, err_cap, "token id " + std::to_string(ids[b][t]) + " at position " +
                                          std::to_string(t) + " of sequence " + std::to_string(b) +
                                          " is out of range [0, " + std::to_string(V) + ")");
                return -1;
            }
        }
    }
    try {
        if (s->cuda) {
            std::string msg;
            if (!cuda_session_forward(s, ids, n_new, last_logits, all_logits, last_tokens, &msg)) {
                set_err(err, err_cap, msg);
                return -1;
            }
            return 0;
        }
        std::vector<float> tmp;
        if (last_tokens && !last_logits) {
            tmp.resize((size_t)(s->n_seq * V));
            last_logits = tmp.data();
        }
        session_forward(s, ids, n_new, last_logits, all_logits);
        for (int32_t b = 0; last_tokens && b < s->n_seq; b++) {
            if (n_new[b] > 0) last_tokens[b] = logits_argmax(last_logits + (int64_t)b * V, (int32_t)V);
        }
        return 0;
    } catch (const std::bad_alloc &) {
        set_err(err, err_cap, "out of memory in the forward pass");
        return -1;
    }
}

}  // namespace ats

using namespace ats;

extern "C" {

int ats_cuda_built(void) { return cuda_built() ? 1 : 0; }

ats_model *ats_model_init(const ats_model_params *params, char *err, size_t err_cap) {
    std::string msg;
    try {
        ats_model *m = model_init(params, &msg);
        if (!m) set_err(err, err_cap, msg);
        return m;
    } catch (const std::bad_alloc &) {
        set_err(err, err_cap, "out of memory while loading the model");
        return nullptr;
    }
}

void ats_model_free(ats_model *model) {
    if (!model) return;
    model->pool.reset();
    cuda_model_free(model->cuda);
    for (StFile &f : model->files) st_close(&f);
    delete model;
}

int32_t ats_model_vocab_size(const ats_model *m) { return (int32_t)m->cfg.vocab_size; }
int32_t ats_model_max_seq_len(const ats_model *m) { return (int32_t)m->cfg.max_seq_len; }
const char *ats_model_config_json(const ats_model *m) { return m->config_text.c_str(); }
const char *ats_model_kernels(const ats_model *m) { return m->cuda ? "cuda" : m->kernels->name; }
const char *ats_model_device(const ats_model *m) { return m->device.c_str(); }
const char *ats_model_kv_cache(const ats_model *m) { return m->kv_f16 ? "f16" : "f32"; }
const char *ats_model_weight_format(const ats_model *m) { return m->weight_format.c_str(); }

int ats_session_forward(ats_session *s, const int32_t *const *ids, const int32_t *n_new,
                        float *last_logits, float *all_logits, char *err, size_t err_cap) {
    return session_forward_tokens(s, ids, n_new, last_logits, all_logits, nullptr, err, err_cap);
}

int ats_model_logits(ats_model *m, const int32_t *ids, int32_t n_seq, int32_t T, float *out,
                     char *err, size_t err_cap) {
    if (n_seq < 1 || T < 1) {
        set_err(err, err_cap, "logits needs at least one sequence of at least one token (got " +
                                  std::to_string(n_seq) + " x " + std::to_string(T) + ")");
        return -1;
    }
    ats_session *s = ats_session_init(m, n_seq, T, err, err_cap);
    if (!s) return -1;
    std::vector<const int32_t *> rows((size_t)n_seq);
    std::vector<int32_t> counts((size_t)n_seq, T);
    for (int32_t b = 0; b < n_seq; b++) rows[(size_t)b] = ids + (int64_t)b * T;
    int rc = ats_session_forward(s, rows.data(), counts.data(), nullptr, out, err, err_cap);
    ats_session_free(s);
    return rc;
}

}  // extern "C"
