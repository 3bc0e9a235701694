/* tokenizer.json -> ats_bpe_encoder (byte ids, merges by rank, pattern) plus an id -> bytes table
 * for decoding. Mirrors ats_tokenizer.hf_json.from_hf_dict: anything that would change encoding
 * and is not implemented is refused with the field named. */
#include "ats/tokenizer_json.h"

#include <stdio.h>

#include <fstream>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "json.h"

/* The two patterns ats_tokenizer names (ats_tokenizer.pretokenize), spelled exactly. */
static const char *GPT4_PATTERN =
    R"PAT((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)PAT";
static const char *GPT2_PATTERN =
    R"PAT('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)PAT";

struct ats_tokenizer {
    ats_bpe_encoder *enc = nullptr;
    std::vector<std::string> id_bytes; /* bytes of each id */
    std::vector<uint8_t> is_token;     /* id is a token (vocab or special) */
};

namespace {

using ats::JsonValue;

struct Build {
    std::string source;
    std::string *err;
    bool fail(const std::string &field, const std::string &problem) {
        *err = source + ": field '" + field + "': " + problem;
        return false;
    }
};

/* GPT-2 / HF ByteLevel byte <-> printable code point map (Radford et al. 2019, encoder.py). */
void byte_to_unicode(uint32_t table[256]) {
    bool keep[256] = {false};
    for (int b = '!'; b <= '~'; b++) keep[b] = true;
    for (int b = 0xA1; b <= 0xAC; b++) keep[b] = true;
    for (int b = 0xAE; b <= 0xFF; b++) keep[b] = true;
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) table[b] = keep[b] ? (uint32_t)b : 256 + n++;
}

/* Decodes a UTF-8 ByteLevel string into bytes; false if a character is outside the alphabet. */
bool unicode_to_bytes(const std::string &s, const std::unordered_map<uint32_t, uint8_t> &inv,
                      std::string *out) {
    out->clear();
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        size_t n;
        if (c < 0x80) { cp = c; n = 1; }
        else if ((c >> 5) == 6) { cp = c & 0x1F; n = 2; }
        else if ((c >> 4) == 14) { cp = c & 0x0F; n = 3; }
        else if ((c >> 3) == 30) { cp = c & 0x07; n = 4; }
        else return false;
        if (i + n > s.size()) return false;
        for (size_t k = 1; k < n; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
        auto it = inv.find(cp);
        if (it == inv.end()) return false;
        out->push_back((char)it->second);
        i += n;
    }
    return true;
}

bool read_pattern(Build &b, const JsonValue *pre, ats_pattern *pattern) {
    if (!pre || pre->type != ats::JSON_OBJECT) return b.fail("pre_tokenizer", "expected a ByteLevel pre-tokenizer");
    const JsonValue *type = pre->get("type");
    std::string kind = type && type->type == ats::JSON_STRING ? type->str : "";
    if (kind == "ByteLevel") {
        const JsonValue *ur = pre->get("use_regex"), *aps = pre->get("add_prefix_space");
        if (aps && aps->type == ats::JSON_BOOL && aps->boolean) return b.fail("pre_tokenizer.add_prefix_space", "true is not supported");
        if (ur && !(ur->type == ats::JSON_BOOL && ur->boolean)) return b.fail("pre_tokenizer.use_regex", "expected true here");
        *pattern = ATS_PATTERN_GPT2;
        return true;
    }
    if (kind != "Sequence") return b.fail("pre_tokenizer.type", "'" + kind + "' is not supported");
    const JsonValue *steps = pre->get("pretokenizers");
    if (!steps || steps->type != ats::JSON_ARRAY || steps->items.size() != 2) {
        return b.fail("pre_tokenizer.pretokenizers", "expected [Split, ByteLevel]");
    }
    const JsonValue &split = steps->items[0], &bl = steps->items[1];
    const JsonValue *st = split.get("type"), *bt = bl.get("type");
    if (!st || st->str != "Split" || !bt || bt->str != "ByteLevel") {
        return b.fail("pre_tokenizer.pretokenizers", "expected [Split, ByteLevel]");
    }
    const JsonValue *pat = split.get("pattern");
    const JsonValue *re = pat ? pat->get("Regex") : nullptr;
    if (!re || re->type != ats::JSON_STRING) return b.fail("pre_tokenizer.pretokenizers[0].pattern", "expected {'Regex': str}");
    const JsonValue *beh = split.get("behavior"), *inv = split.get("invert");
    if (!beh || beh->str != "Isolated" || (inv && inv->type == ats::JSON_BOOL && inv->boolean)) {
        return b.fail("pre_tokenizer.pretokenizers[0]", "only behavior Isolated, invert false");
    }
    const JsonValue *ur = bl.get("use_regex");
    if (!ur || ur->type != ats::JSON_BOOL || ur->boolean) return b.fail("pre_tokenizer.pretokenizers[1].use_regex", "expected false here");
    if (re->str == GPT4_PATTERN) *pattern = ATS_PATTERN_GPT4;
    else if (re->str == GPT2_PATTERN) *pattern = ATS_PATTERN_GPT2;
    else return b.fail("pre_tokenizer.pretokenizers[0].pattern.Regex", "only the gpt4 and gpt2 patterns are implemented natively");
    return true;
}

ats_tokenizer *build(const std::string &path, std::string *err) {
    Build b{path, err};
    auto bad = [&](const std::string &field, const std::string &problem) -> ats_tokenizer * {
        b.fail(field, problem);
        return nullptr;
    };
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        *err = path + ": cannot open";
        return nullptr;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    JsonValue root;
    std::string jerr;
    if (!ats::json_parse(text.data(), text.size(), &root, &jerr)) {
        *err = path + ": " + jerr;
        return nullptr;
    }
    const JsonValue *model = root.get("model");
    if (!model || model->type != ats::JSON_OBJECT) return bad("model", "missing: this is not a tokenizer.json");
    for (const char *key : {"normalizer", "truncation", "padding"}) {
        const JsonValue *v = root.get(key);
        if (v && v->type != ats::JSON_NULL) return bad(key, "is not supported (must be null)");
    }
    const JsonValue *mt = model->get("type");
    if (mt && (mt->type != ats::JSON_STRING || mt->str != "BPE")) return bad("model.type", "only BPE is supported");
    for (const char *key : {"dropout", "unk_token"}) {
        const JsonValue *v = model->get(key);
        if (v && v->type != ats::JSON_NULL) return bad(std::string("model.") + key, "is not supported");
    }
    for (const char *key : {"byte_fallback", "ignore_merges"}) {
        const JsonValue *v = model->get(key);
        if (v && !(v->type == ats::JSON_NULL || (v->type == ats::JSON_BOOL && !v->boolean))) {
            return bad(std::string("model.") + key, "is not supported");
        }
    }
    ats_pattern pattern;
    if (!read_pattern(b, root.get("pre_tokenizer"), &pattern)) return nullptr;
    const JsonValue *vocab = model->get("vocab"), *merges = model->get("merges");
    if (!vocab || vocab->type != ats::JSON_OBJECT || !merges || merges->type != ats::JSON_ARRAY) {
        return bad("model", "needs a 'vocab' object and a 'merges' list");
    }
    uint32_t table[256];
    byte_to_unicode(table);
    std::unordered_map<uint32_t, uint8_t> inv;
    for (int i = 0; i < 256; i++) inv[table[i]] = (uint8_t)i;

    std::unique_ptr<ats_tokenizer> tok(new ats_tokenizer());
    std::unordered_map<std::string, int32_t> ids; /* ByteLevel string -> id */
    int64_t max_id = -1;
    for (size_t i = 0; i < vocab->keys.size(); i++) {
        const JsonValue &v = vocab->items[i];
        if (v.type != ats::JSON_NUMBER || !v.is_int || v.integer < 0 || v.integer >= (1 << 30)) {
            return bad("model.vocab", "entry '" + vocab->keys[i] + "' needs a non-negative integer id");
        }
        ids[vocab->keys[i]] = (int32_t)v.integer;
        if (v.integer > max_id) max_id = v.integer;
    }
    const JsonValue *added = root.get("added_tokens");
    std::vector<std::pair<int32_t, std::string>> specials;
    if (added && added->type == ats::JSON_ARRAY) {
        for (size_t i = 0; i < added->items.size(); i++) {
            const JsonValue &a = added->items[i];
            const JsonValue *content = a.get("content"), *id = a.get("id"), *special = a.get("special");
            std::string field = "added_tokens[" + std::to_string(i) + "]";
            if (!content || content->type != ats::JSON_STRING || content->str.empty() || !id || !id->is_int ||
                id->integer < 0 || id->integer >= (1 << 30)) {
                return bad(field, "needs a non-empty 'content' and an integer 'id'");
            }
            if (!special || special->type != ats::JSON_BOOL || !special->boolean) {
                return bad(field + ".special", "non-special added tokens are not supported");
            }
            specials.push_back({(int32_t)id->integer, content->str});
            if (id->integer > max_id) max_id = id->integer;
        }
    }
    /* ids index a table: a tokenizer's ids are 0 .. n_tokens - 1, so a larger id is malformed
     * (and would otherwise size the table from the file: a 4 GB allocation, found by fuzzing) */
    size_t n_tokens = vocab->keys.size() + specials.size();
    if (max_id >= (int64_t)n_tokens) {
        return bad("model.vocab", "token id " + std::to_string(max_id) + " is not below the " +
                                      std::to_string(n_tokens) + " tokens of vocab and added_tokens");
    }
    tok->id_bytes.resize((size_t)(max_id + 1));
    tok->is_token.assign((size_t)(max_id + 1), 0);
    std::string bytes;
    for (const auto &kv : ids) {
        if (!unicode_to_bytes(kv.first, inv, &bytes)) {
            return bad("model.vocab", "token '" + kv.first + "' is not in the ByteLevel alphabet");
        }
        tok->id_bytes[(size_t)kv.second] = bytes;
        tok->is_token[(size_t)kv.second] = 1;
    }
    for (const auto &sp : specials) {
        tok->id_bytes[(size_t)sp.first] = sp.second;
        tok->is_token[(size_t)sp.first] = 1;
    }
    std::vector<int32_t> byte_ids(256);
    for (int bb = 0; bb < 256; bb++) {
        std::string s;
        uint32_t cp = table[bb];
        if (cp < 0x80) s.push_back((char)cp);
        else {
            s.push_back((char)(0xC0 | (cp >> 6)));
            s.push_back((char)(0x80 | (cp & 0x3F)));
        }
        auto it = ids.find(s);
        if (it == ids.end()) {
            char msg[64];
            snprintf(msg, sizeof msg, "byte 0x%02X has no token", bb);
            return bad("model.vocab", msg);
        }
        byte_ids[(size_t)bb] = it->second;
    }
    std::vector<int32_t> rows;
    for (size_t r = 0; r < merges->items.size(); r++) {
        const JsonValue &e = merges->items[r];
        std::string field = "model.merges[" + std::to_string(r) + "]";
        std::string left, right;
        if (e.type == ats::JSON_STRING) {
            size_t sp = e.str.find(' ');
            if (sp == std::string::npos || e.str.find(' ', sp + 1) != std::string::npos) {
                return bad(field, "expected two tokens");
            }
            left = e.str.substr(0, sp);
            right = e.str.substr(sp + 1);
        } else if (e.type == ats::JSON_ARRAY && e.items.size() == 2 && e.items[0].type == ats::JSON_STRING &&
                   e.items[1].type == ats::JSON_STRING) {
            left = e.items[0].str;
            right = e.items[1].str;
        } else {
            return bad(field, "expected 'a b' or [a, b]");
        }
        auto l = ids.find(left), rr = ids.find(right), m = ids.find(left + right);
        if (l == ids.end() || rr == ids.end() || m == ids.end()) {
            return bad(field, "a token of this merge is not in model.vocab");
        }
        rows.push_back(l->second);
        rows.push_back(rr->second);
        rows.push_back(m->second);
    }
    ats_bpe_encoder_params params{byte_ids.data(), rows.data(), rows.size() / 3, pattern};
    char cerr[512];
    tok->enc = ats_bpe_encoder_init(&params, cerr, sizeof cerr);
    if (!tok->enc) {
        *err = path + ": " + cerr;
        return nullptr;
    }
    return tok.release();
}

}  // namespace

extern "C" {

ats_tokenizer *ats_tokenizer_init(const char *path, char *err, size_t err_cap) {
    std::string msg;
    ats_tokenizer *t = nullptr;
    try {
        t = build(path ? path : "", &msg);
    } catch (const std::bad_alloc &) {
        msg = "out of memory reading tokenizer.json";
    }
    if (!t && err && err_cap) snprintf(err, err_cap, "%s", msg.c_str());
    return t;
}

void ats_tokenizer_free(ats_tokenizer *tok) {
    if (!tok) return;
    ats_bpe_encoder_free(tok->enc);
    delete tok;
}

int32_t ats_tokenizer_vocab_size(const ats_tokenizer *tok) { return (int32_t)tok->id_bytes.size(); }

void ats_tokenizer_encode(const ats_tokenizer *tok, const char *text, size_t len, ats_ids *out) {
    ats_bpe_encoder_encode(tok->enc, text, len, out);
}

const char *ats_tokenizer_id_bytes(const ats_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || (size_t)id >= tok->id_bytes.size() || !tok->is_token[(size_t)id]) return nullptr;
    *len = tok->id_bytes[(size_t)id].size();
    return tok->id_bytes[(size_t)id].data();
}

}  // extern "C"
