/* config.json -> Config: every key ModelConfig.to_dict() writes must be present (a default filling
 * a missing key would load a different architecture), with the right JSON type and a valid value. */
#include <math.h>

#include "json.h"
#include "model_impl.h"

namespace ats {

namespace {

struct Reader {
    const JsonValue *obj;
    std::string prefix; /* "moe." for sub-configs */
    std::string *err;

    const JsonValue *need(const char *key) {
        const JsonValue *v = obj->get(key);
        if (!v) *err = "config.json: missing key '" + prefix + key + "'";
        return v;
    }
    bool bad(const char *key, const char *expected) {
        *err = "config.json: key '" + prefix + key + "' must be " + expected;
        return false;
    }
    bool integer(const char *key, int64_t *out, int64_t min) {
        const JsonValue *v = need(key);
        if (!v) return false;
        if (v->type != JSON_NUMBER || !v->is_int || v->integer < min) {
            return bad(key, min == 1 ? "an integer >= 1" : (min == 0 ? "an integer >= 0" : "an integer"));
        }
        *out = v->integer;
        return true;
    }
    /* integer or null (-> fallback) */
    bool opt_integer(const char *key, int64_t *out, int64_t fallback) {
        const JsonValue *v = need(key);
        if (!v) return false;
        if (v->type == JSON_NULL) {
            *out = fallback;
            return true;
        }
        return integer(key, out, 1);
    }
    bool number(const char *key, double *out) {
        const JsonValue *v = need(key);
        if (!v) return false;
        if (v->type != JSON_NUMBER || !isfinite(v->number)) return bad(key, "a finite number");
        *out = v->number;
        return true;
    }
    bool boolean(const char *key, bool *out) {
        const JsonValue *v = need(key);
        if (!v) return false;
        if (v->type != JSON_BOOL) return bad(key, "true or false");
        *out = v->boolean;
        return true;
    }
    bool string(const char *key, std::string *out) {
        const JsonValue *v = need(key);
        if (!v) return false;
        if (v->type != JSON_STRING) return bad(key, "a string");
        *out = v->str;
        return true;
    }
    /* sub-object or null: *present says which */
    bool sub(const char *key, const JsonValue **out) {
        const JsonValue *v = need(key);
        if (!v) return false;
        if (v->type != JSON_NULL && v->type != JSON_OBJECT) return bad(key, "an object or null");
        *out = v->type == JSON_OBJECT ? v : nullptr;
        return true;
    }
};

bool fail(std::string *err, const std::string &msg) {
    *err = "config.json: " + msg;
    return false;
}

}  // namespace

bool config_parse(const std::string &text, Config *c, std::string *err) {
    JsonValue root;
    std::string jerr;
    if (!json_parse(text.data(), text.size(), &root, &jerr)) return fail(err, jerr);
    if (root.type != JSON_OBJECT) return fail(err, "expected a JSON object");
    Reader r{&root, "", err};
    int64_t version = 0;
    if (!r.integer("format_version", &version, 0)) return false;
    if (version != 1) return fail(err, "format_version = " + std::to_string(version) + ", expected 1");
    if (!r.string("family", &c->family)) return false;
    if (c->family != "dense" && c->family != "moe" && c->family != "mod" && c->family != "hybrid") {
        return fail(err, "family '" + c->family + "' is not one of dense, moe, mod, hybrid");
    }
    const JsonValue *rs = nullptr, *moe = nullptr, *mod = nullptr;
    if (!r.integer("vocab_size", &c->vocab_size, 1) || !r.integer("dim", &c->dim, 1) ||
        !r.integer("n_layer", &c->n_layer, 1) || !r.integer("n_head", &c->n_head, 1) ||
        !r.opt_integer("n_kv_head", &c->n_kv_head, c->n_head) ||
        !r.opt_integer("head_dim", &c->head_dim, c->dim / c->n_head) ||
        !r.integer("ffn_dim", &c->ffn_dim, 1) || !r.integer("max_seq_len", &c->max_seq_len, 1) ||
        !r.number("rope_theta", &c->rope_theta) || !r.sub("rope_scaling", &rs) ||
        !r.number("norm_eps", &c->norm_eps) || !r.boolean("tie_embeddings", &c->tie_embeddings) ||
        !r.sub("moe", &moe) || !r.sub("mod", &mod)) {
        return false;
    }
    double init_std;
    if (!r.number("init_std", &init_std)) return false;
    if (c->n_head % c->n_kv_head != 0) return fail(err, "n_kv_head must divide n_head");
    if (c->head_dim < 2 || c->head_dim % 2 != 0) return fail(err, "head_dim must be even and >= 2");
    if (!(c->rope_theta > 0) || !(c->norm_eps > 0)) return fail(err, "rope_theta and norm_eps must be > 0");
    /* sizes a int32 index must hold comfortably */
    if (c->vocab_size > (1 << 30) || c->dim > (1 << 20) || c->n_layer > 4096 || c->n_head > 4096 ||
        c->head_dim > 4096 || c->ffn_dim > (1 << 22) || c->max_seq_len > (1 << 24)) {
        return fail(err, "a size field is implausibly large");
    }
    if (c->max_seq_len * c->head_dim > (1LL << 28)) { /* RoPE tables are built for every position */
        return fail(err, "max_seq_len * head_dim = " + std::to_string(c->max_seq_len * c->head_dim) +
                             " exceeds the 2^28 RoPE table entries the runtime builds");
    }
    c->rope_scaling = rs != nullptr;
    if (rs) {
        Reader s{rs, "rope_scaling.", err};
        if (!s.number("factor", &c->rs_factor) || !s.number("low_freq_factor", &c->rs_low_freq_factor) ||
            !s.number("high_freq_factor", &c->rs_high_freq_factor) ||
            !s.number("original_max_seq_len", &c->rs_original_max_seq_len)) {
            return false;
        }
        if (!(c->rs_factor >= 1) || !(0 < c->rs_low_freq_factor) ||
            !(c->rs_low_freq_factor < c->rs_high_freq_factor) || !(c->rs_original_max_seq_len >= 1)) {
            return fail(err, "rope_scaling values are invalid");
        }
    }
    bool needs_moe = c->family == "moe" || c->family == "hybrid";
    bool needs_mod = c->family == "mod" || c->family == "hybrid";
    if (needs_moe != (moe != nullptr)) {
        return fail(err, std::string("moe must be ") + (needs_moe ? "an object" : "null") +
                             " for family '" + c->family + "'");
    }
    if (needs_mod != (mod != nullptr)) {
        return fail(err, std::string("mod must be ") + (needs_mod ? "an object" : "null") +
                             " for family '" + c->family + "'");
    }
    c->has_moe = needs_moe;
    if (moe) {
        Reader m{moe, "moe.", err};
        const JsonValue *cf;
        double bias_rate;
        if (!m.integer("n_experts", &c->n_experts, 1) || !m.integer("top_k", &c->top_k, 1) ||
            !(cf = m.need("capacity_factor")) ||
            !m.number("router_temperature", &c->router_temperature) ||
            !m.boolean("norm_topk", &c->norm_topk) ||
            !m.integer("n_shared_experts", &c->n_shared_experts, 0) ||
            !m.number("bias_update_rate", &bias_rate)) {
            return false;
        }
        if (c->top_k > c->n_experts || c->n_experts > 4096 || c->n_shared_experts > 64) {
            return fail(err, "moe.top_k must be <= moe.n_experts (<= 4096)");
        }
        if (!(c->router_temperature > 0)) return fail(err, "moe.router_temperature must be > 0");
        c->has_capacity = cf->type != JSON_NULL;
        if (c->has_capacity) {
            if (cf->type != JSON_NUMBER || !(cf->number > 0)) {
                return fail(err, "moe.capacity_factor must be null or a number > 0");
            }
            c->capacity_factor = cf->number;
        }
    }
    c->has_mod = needs_mod;
    if (mod) {
        Reader m{mod, "mod.", err};
        if (!m.number("capacity", &c->mod_capacity) || !m.string("routing", &c->mod_routing) ||
            !m.string("placement", &c->mod_placement) || !m.integer("every_n", &c->mod_every_n, 1) ||
            !m.integer("predictor_dim", &c->mod_predictor_dim, 1) || !m.integer("seed", &c->mod_seed, INT64_MIN)) {
            return false;
        }
        if (!(c->mod_capacity > 0 && c->mod_capacity <= 1)) return fail(err, "mod.capacity must be in (0, 1]");
        if (c->mod_routing != "learned" && c->mod_routing != "static" && c->mod_routing != "random") {
            return fail(err, "mod.routing '" + c->mod_routing + "' is not learned, static or random");
        }
        if (c->mod_placement != "all" && c->mod_placement != "later_half" &&
            c->mod_placement != "every_n") {
            return fail(err, "mod.placement '" + c->mod_placement + "' is not all, later_half or every_n");
        }
    }
    return true;
}

}  // namespace ats
