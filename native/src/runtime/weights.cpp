/* Loads the tensors of a model directory into weight views: single-file or sharded safetensors
 * (HF index), F32 used in place from the mmap, BF16 converted once to owned fp32, int8/int4
 * matmul weights (quantization.json) kept packed. Every expected tensor must be present with its
 * exact shape and dtype, and every tensor present must be expected. */
#include <stdint.h>
#include <string.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "json.h"
#include "model_impl.h"

namespace ats {

namespace {

std::string shape_str(const std::vector<int64_t> &s) {
    std::string out = "(";
    for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + (s.size() == 1 ? ",)" : ")");
}

bool read_file(const std::string &path, std::string *out, std::string *err) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        *err = path + ": cannot open";
        return false;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return true;
}

bool file_exists(const std::string &path) {
    std::ifstream f(path);
    return (bool)f;
}

struct Loader {
    ats_model *m = nullptr;
    std::string dir;
    std::string *err = nullptr;
    std::map<std::string, const StTensor *> by_name;
    std::map<std::string, std::string> file_of; /* tensor -> file name, for messages */
    std::set<std::string> used;
    int bits = 0; /* 0 = float model, else 8 or 4 */
    int group = 0;
    std::set<std::string> quantized;
    bool saw_bf16 = false;

    bool fail(const std::string &msg) {
        *err = msg;
        return false;
    }

    bool open_files() {
        std::string index = dir + "/model.safetensors.index.json";
        std::vector<std::string> names;
        if (file_exists(index)) {
            std::string text;
            if (!read_file(index, &text, err)) return false;
            JsonValue root;
            std::string jerr;
            if (!json_parse(text.data(), text.size(), &root, &jerr)) {
                return fail("model.safetensors.index.json: " + jerr);
            }
            const JsonValue *map = root.get("weight_map");
            if (!map || map->type != JSON_OBJECT) {
                return fail("model.safetensors.index.json: missing object 'weight_map'");
            }
            for (const JsonValue &v : map->items) {
                if (v.type != JSON_STRING || v.str.empty() || v.str.find('/') != std::string::npos ||
                    v.str == "." || v.str == "..") {
                    return fail("model.safetensors.index.json: weight_map values must be file names");
                }
                bool seen = false;
                for (const std::string &n : names) seen = seen || n == v.str;
                if (!seen) names.push_back(v.str);
            }
        } else {
            names.push_back("model.safetensors");
        }
        for (const std::string &name : names) {
            m->files.emplace_back();
            if (!st_open(dir + "/" + name, &m->files.back(), err)) {
                m->files.pop_back();
                return false;
            }
        }
        for (const StFile &f : m->files) {
            for (const StTensor &t : f.tensors) {
                if (by_name.count(t.name)) return fail(f.path + ": tensor " + t.name + " is in two files");
                by_name[t.name] = &t;
                file_of[t.name] = f.path;
            }
        }
        return true;
    }

    bool read_quantization() {
        std::string path = dir + "/quantization.json";
        if (!file_exists(path)) return true;
        std::string text;
        if (!read_file(path, &text, err)) return false;
        JsonValue q;
        std::string jerr;
        if (!json_parse(text.data(), text.size(), &q, &jerr)) return fail("quantization.json: " + jerr);
        const JsonValue *ver = q.get("format_version"), *b = q.get("bits"), *g = q.get("group_size"),
                        *scheme = q.get("scheme"), *list = q.get("quantized");
        if (!ver || !ver->is_int || ver->integer != 1) return fail("quantization.json: format_version must be 1");
        if (!b || !b->is_int || (b->integer != 8 && b->integer != 4)) {
            return fail("quantization.json: key 'bits' must be 8 or 4");
        }
        bits = (int)b->integer;
        if (!g) return fail("quantization.json: missing key 'group_size'");
        if (bits == 8 && g->type != JSON_NULL) return fail("quantization.json: group_size must be null for int8");
        if (bits == 4) {
            if (!g->is_int || (g->integer != 32 && g->integer != 64 && g->integer != 128)) {
                return fail("quantization.json: group_size must be 32, 64 or 128 for int4");
            }
            group = (int)g->integer;
        }
        if (!scheme || scheme->type != JSON_STRING || scheme->str != "symmetric") {
            return fail("quantization.json: scheme must be 'symmetric'");
        }
        if (!list || list->type != JSON_ARRAY) return fail("quantization.json: missing list 'quantized'");
        for (const JsonValue &v : list->items) {
            if (v.type != JSON_STRING) return fail("quantization.json: 'quantized' must list strings");
            quantized.insert(v.str);
        }
        return true;
    }

    const StTensor *find(const std::string &name, const std::vector<int64_t> &shape) {
        auto it = by_name.find(name);
        if (it == by_name.end()) {
            fail("model.safetensors: missing tensor " + name + " (shape " + shape_str(shape) +
                 ", expected from config.json)");
            return nullptr;
        }
        const StTensor *t = it->second;
        if (t->shape != shape) {
            fail(file_of[name] + ": " + name + " has shape " + shape_str(t->shape) + ", expected " +
                 shape_str(shape) + " from config.json");
            return nullptr;
        }
        used.insert(name);
        return t;
    }

    /* A float tensor (F32 in place when aligned, else an owned fp32 copy; BF16 converted). */
    bool load_float(const std::string &name, const std::vector<int64_t> &shape, const float **out) {
        const StTensor *t = find(name, shape);
        if (!t) return false;
        size_t count = 1;
        for (int64_t d : shape) count *= (size_t)d;
        if (t->dtype == "F32") {
            if ((uintptr_t)t->data % alignof(float) == 0) {
                *out = (const float *)t->data;
                return true;
            }
            float *copy = new float[count];
            memcpy(copy, t->data, count * sizeof(float));
            m->owned.emplace_back(copy);
            *out = copy;
            return true;
        }
        if (t->dtype == "BF16") {
            saw_bf16 = true;
            float *copy = new float[count];
            for (size_t i = 0; i < count; i++) {
                uint32_t bits32 = (uint32_t)(t->data[2 * i] | (t->data[2 * i + 1] << 8)) << 16;
                memcpy(&copy[i], &bits32, 4);
            }
            m->owned.emplace_back(copy);
            *out = copy;
            return true;
        }
        return fail(file_of[name] + ": " + name + " has dtype " + t->dtype + ", expected F32 or BF16");
    }

    /* A matmul weight of shape (..., rows, cols): float, or N.q + N.scale when listed quantized. */
    bool load_matrix(const std::string &name, const std::vector<int64_t> &shape, Weight *w) {
        w->rows = shape[shape.size() - 2];
        w->cols = shape[shape.size() - 1];
        if (!quantized.count(name)) {
            w->type = WEIGHT_F32;
            return load_float(name, shape, &w->f32);
        }
        std::vector<int64_t> qshape = shape, sshape(shape.begin(), shape.end() - 1);
        const StTensor *q;
        if (bits == 8) {
            w->type = WEIGHT_Q8;
            if (!(q = find(name + ".q", qshape))) return false;
            if (q->dtype != "I8") return fail(file_of[name + ".q"] + ": " + name + ".q has dtype " + q->dtype + ", expected I8");
            w->q8 = (const int8_t *)q->data;
        } else {
            if (w->cols % group != 0) {
                return fail(name + ": in features " + std::to_string(w->cols) +
                            " are not divisible by group_size " + std::to_string(group));
            }
            w->type = WEIGHT_Q4;
            w->group = group;
            qshape.back() = w->cols / 2;
            sshape.push_back(w->cols / group);
            if (!(q = find(name + ".q", qshape))) return false;
            if (q->dtype != "U8") return fail(file_of[name + ".q"] + ": " + name + ".q has dtype " + q->dtype + ", expected U8");
            w->q4 = q->data;
        }
        const StTensor *s = find(name + ".scale", sshape);
        if (!s) return false;
        if (s->dtype != "F32") return fail(file_of[name + ".scale"] + ": " + name + ".scale has dtype " + s->dtype + ", expected F32");
        if ((uintptr_t)s->data % alignof(float) != 0) {
            size_t count = s->nbytes / 4;
            float *copy = new float[count];
            memcpy(copy, s->data, s->nbytes);
            m->owned.emplace_back(copy);
            w->scale = copy;
        } else {
            w->scale = (const float *)s->data;
        }
        return true;
    }

    bool load_layer(int64_t i, Layer *L) {
        const Config &c = m->cfg;
        std::string p = "layers." + std::to_string(i) + ".";
        int64_t C = c.dim, H = c.n_head * c.head_dim, KV = c.n_kv_head * c.head_dim, F = c.ffn_dim;
        if (!load_float(p + "attn_norm.weight", {C}, &L->attn_norm) ||
            !load_float(p + "ffn_norm.weight", {C}, &L->ffn_norm) ||
            !load_matrix(p + "attn.wq.weight", {H, C}, &L->wq) ||
            !load_matrix(p + "attn.wk.weight", {KV, C}, &L->wk) ||
            !load_matrix(p + "attn.wv.weight", {KV, C}, &L->wv) ||
            !load_matrix(p + "attn.wo.weight", {C, H}, &L->wo)) {
            return false;
        }
        if (c.has_moe) {
            int64_t E = c.n_experts;
            if (!load_float(p + "ffn.router.weight", {E, C}, &L->router) ||
                !load_float(p + "ffn.expert_bias", {E}, &L->expert_bias) ||
                !load_matrix(p + "ffn.experts.w1", {E, F, C}, &L->ew1) ||
                !load_matrix(p + "ffn.experts.w3", {E, F, C}, &L->ew3) ||
                !load_matrix(p + "ffn.experts.w2", {E, C, F}, &L->ew2)) {
                return false;
            }
            L->has_shared = c.n_shared_experts > 0;
            int64_t S = c.n_shared_experts * F;
            if (L->has_shared && (!load_matrix(p + "ffn.shared.w1.weight", {S, C}, &L->sw1) ||
                                  !load_matrix(p + "ffn.shared.w3.weight", {S, C}, &L->sw3) ||
                                  !load_matrix(p + "ffn.shared.w2.weight", {C, S}, &L->sw2))) {
                return false;
            }
        } else if (!load_matrix(p + "ffn.w1.weight", {F, C}, &L->w1) ||
                   !load_matrix(p + "ffn.w3.weight", {F, C}, &L->w3) ||
                   !load_matrix(p + "ffn.w2.weight", {C, F}, &L->w2)) {
            return false;
        }
        if (c.has_mod) {
            const std::string &pl = c.mod_placement;
            L->is_mod = pl == "all" || (pl == "later_half" && i >= c.n_layer / 2) ||
                        (pl == "every_n" && i % c.mod_every_n == c.mod_every_n - 1);
            L->mod_seed = c.mod_seed * 100003 + i;
            if (L->is_mod && c.mod_routing == "learned") {
                int64_t P = c.mod_predictor_dim;
                if (!load_float(p + "mod_router.weight", {1, C}, &L->mod_router) ||
                    !load_float(p + "mod_predictor.w_in.weight", {P, C}, &L->pred_in) ||
                    !load_float(p + "mod_predictor.w_out.weight", {1, P}, &L->pred_out)) {
                    return false;
                }
            }
        }
        return true;
    }

    bool load_all() {
        const Config &c = m->cfg;
        if (!read_quantization() || !open_files()) return false;
        if (!load_float("tok_embeddings.weight", {c.vocab_size, c.dim}, &m->tok_embeddings) ||
            !load_float("norm.weight", {c.dim}, &m->norm)) {
            return false;
        }
        m->layers.resize((size_t)c.n_layer);
        for (int64_t i = 0; i < c.n_layer; i++) {
            if (!load_layer(i, &m->layers[(size_t)i])) return false;
        }
        if (c.tie_embeddings) {
            m->output.type = WEIGHT_F32;
            m->output.rows = c.vocab_size;
            m->output.cols = c.dim;
            m->output.f32 = m->tok_embeddings;
        } else if (!load_matrix("output.weight", {c.vocab_size, c.dim}, &m->output)) {
            return false;
        }
        for (const auto &kv : by_name) {
            if (!used.count(kv.first)) {
                return fail(file_of[kv.first] + ": unexpected tensor " + kv.first +
                            " (not in the model config.json describes)");
            }
        }
        for (const std::string &name : quantized) {
            if (!used.count(name + ".q")) {
                return fail("quantization.json: lists " + name + ", which is not a matmul weight of this model");
            }
        }
        m->weight_format = bits == 8 ? "int8" : bits == 4 ? "int4" : saw_bf16 ? "bf16" : "f32";
        return true;
    }
};

}  // namespace

bool weights_load(ats_model *model, const std::string &dir, std::string *err) {
    Loader l;
    l.m = model;
    l.dir = dir;
    l.err = err;
    return l.load_all();
}

}  // namespace ats
