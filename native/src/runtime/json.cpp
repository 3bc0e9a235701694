/* Recursive-descent JSON parser (RFC 8259) over a bounded buffer: every read checks the end,
 * nesting is capped at JSON_MAX_DEPTH so hostile input cannot exhaust the stack. */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace ats {

const JsonValue *JsonValue::get(const char *key) const {
    if (type != JSON_OBJECT) return nullptr;
    for (size_t i = 0; i < keys.size(); i++) {
        if (keys[i] == key) return &items[i];
    }
    return nullptr;
}

const char *json_type_name(JsonType t) {
    switch (t) {
        case JSON_NULL: return "null";
        case JSON_BOOL: return "bool";
        case JSON_NUMBER: return "number";
        case JSON_STRING: return "string";
        case JSON_ARRAY: return "array";
        case JSON_OBJECT: return "object";
    }
    return "?";
}

namespace {

struct Parser {
    const char *p;
    size_t len;
    size_t pos;
    std::string *err;

    bool fail(const char *what) {
        char buf[160];
        snprintf(buf, sizeof buf, "invalid JSON at byte %zu: %s", pos, what);
        *err = buf;
        return false;
    }
    void skip_ws() {
        while (pos < len && (p[pos] == ' ' || p[pos] == '\t' || p[pos] == '\n' || p[pos] == '\r'))
            pos++;
    }
    bool literal(const char *word) {
        size_t n = strlen(word);
        if (len - pos < n || memcmp(p + pos, word, n) != 0) return fail("unknown literal");
        pos += n;
        return true;
    }
    bool hex4(uint32_t *out) {
        if (len - pos < 4) return fail("truncated \\u escape");
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) {
            char c = p[pos + i];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
            else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
            else return fail("bad hex digit in \\u escape");
        }
        pos += 4;
        *out = v;
        return true;
    }
    static void put_utf8(std::string *s, uint32_t cp) {
        if (cp < 0x80) {
            s->push_back((char)cp);
        } else if (cp < 0x800) {
            s->push_back((char)(0xC0 | (cp >> 6)));
            s->push_back((char)(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
            s->push_back((char)(0xE0 | (cp >> 12)));
            s->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
            s->push_back((char)(0x80 | (cp & 0x3F)));
        } else {
            s->push_back((char)(0xF0 | (cp >> 18)));
            s->push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
            s->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
            s->push_back((char)(0x80 | (cp & 0x3F)));
        }
    }
    bool string(std::string *out) {
        pos++; /* opening quote */
        out->clear();
        while (true) {
            if (pos >= len) return fail("unterminated string");
            unsigned char c = (unsigned char)p[pos];
            if (c == '"') {
                pos++;
                return true;
            }
            if (c < 0x20) return fail("control character in string");
            if (c != '\\') {
                out->push_back((char)c);
                pos++;
                continue;
            }
            pos++;
            if (pos >= len) return fail("unterminated escape");
            char e = p[pos++];
            switch (e) {
                case '"': out->push_back('"'); break;
                case '\\': out->push_back('\\'); break;
                case '/': out->push_back('/'); break;
                case 'b': out->push_back('\b'); break;
                case 'f': out->push_back('\f'); break;
                case 'n': out->push_back('\n'); break;
                case 'r': out->push_back('\r'); break;
                case 't': out->push_back('\t'); break;
                case 'u': {
                    uint32_t cp;
                    if (!hex4(&cp)) return false;
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        uint32_t lo;
                        if (len - pos < 2 || p[pos] != '\\' || p[pos + 1] != 'u')
                            return fail("lone high surrogate in \\u escape");
                        pos += 2;
                        if (!hex4(&lo)) return false;
                        if (lo < 0xDC00 || lo > 0xDFFF) return fail("bad low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        return fail("lone low surrogate in \\u escape");
                    }
                    put_utf8(out, cp);
                    break;
                }
                default: return fail("unknown escape");
            }
        }
    }
    bool number(JsonValue *out) {
        size_t start = pos;
        bool integral = true;
        if (pos < len && p[pos] == '-') pos++;
        if (pos >= len || p[pos] < '0' || p[pos] > '9') return fail("bad number");
        if (p[pos] == '0') {
            pos++;
        } else {
            while (pos < len && p[pos] >= '0' && p[pos] <= '9') pos++;
        }
        if (pos < len && p[pos] == '.') {
            integral = false;
            pos++;
            if (pos >= len || p[pos] < '0' || p[pos] > '9') return fail("bad fraction");
            while (pos < len && p[pos] >= '0' && p[pos] <= '9') pos++;
        }
        if (pos < len && (p[pos] == 'e' || p[pos] == 'E')) {
            integral = false;
            pos++;
            if (pos < len && (p[pos] == '+' || p[pos] == '-')) pos++;
            if (pos >= len || p[pos] < '0' || p[pos] > '9') return fail("bad exponent");
            while (pos < len && p[pos] >= '0' && p[pos] <= '9') pos++;
        }
        size_t n = pos - start;
        if (n > 400) return fail("number too long");
        char buf[401];
        memcpy(buf, p + start, n);
        buf[n] = 0;
        out->type = JSON_NUMBER;
        out->number = strtod(buf, nullptr);
        out->is_int = false;
        if (integral) {
            /* exact int64 parse with overflow detection (safetensors offsets exceed 2^53 in theory) */
            bool neg = buf[0] == '-';
            uint64_t v = 0;
            bool overflow = false;
            for (size_t i = neg ? 1 : 0; i < n; i++) {
                uint64_t d = (uint64_t)(buf[i] - '0');
                if (v > (UINT64_MAX - d) / 10) {
                    overflow = true;
                    break;
                }
                v = v * 10 + d;
            }
            if (!overflow && v <= (uint64_t)INT64_MAX) {
                out->is_int = true;
                out->integer = neg ? -(int64_t)v : (int64_t)v;
            }
        }
        return true;
    }
    bool value(JsonValue *out, int depth) {
        if (depth > JSON_MAX_DEPTH) return fail("nesting deeper than the limit");
        skip_ws();
        if (pos >= len) return fail("unexpected end of input");
        char c = p[pos];
        if (c == '{') {
            out->type = JSON_OBJECT;
            pos++;
            skip_ws();
            if (pos < len && p[pos] == '}') {
                pos++;
                return true;
            }
            while (true) {
                skip_ws();
                if (pos >= len || p[pos] != '"') return fail("expected a string key");
                out->keys.emplace_back();
                if (!string(&out->keys.back())) return false;
                skip_ws();
                if (pos >= len || p[pos] != ':') return fail("expected ':'");
                pos++;
                out->items.emplace_back();
                if (!value(&out->items.back(), depth + 1)) return false;
                skip_ws();
                if (pos >= len) return fail("unterminated object");
                if (p[pos] == ',') {
                    pos++;
                    continue;
                }
                if (p[pos] == '}') {
                    pos++;
                    return true;
                }
                return fail("expected ',' or '}'");
            }
        }
        if (c == '[') {
            out->type = JSON_ARRAY;
            pos++;
            skip_ws();
            if (pos < len && p[pos] == ']') {
                pos++;
                return true;
            }
            while (true) {
                out->items.emplace_back();
                if (!value(&out->items.back(), depth + 1)) return false;
                skip_ws();
                if (pos >= len) return fail("unterminated array");
                if (p[pos] == ',') {
                    pos++;
                    continue;
                }
                if (p[pos] == ']') {
                    pos++;
                    return true;
                }
                return fail("expected ',' or ']'");
            }
        }
        if (c == '"') {
            out->type = JSON_STRING;
            return string(&out->str);
        }
        if (c == 't') {
            out->type = JSON_BOOL;
            out->boolean = true;
            return literal("true");
        }
        if (c == 'f') {
            out->type = JSON_BOOL;
            out->boolean = false;
            return literal("false");
        }
        if (c == 'n') {
            out->type = JSON_NULL;
            return literal("null");
        }
        return number(out);
    }
};

}  // namespace

bool json_parse(const char *text, size_t len, JsonValue *out, std::string *err) {
    *out = JsonValue();
    Parser ps{text, len, 0, err};
    if (!ps.value(out, 0)) return false;
    ps.skip_ws();
    if (ps.pos != len) return ps.fail("trailing characters after the document");
    return true;
}

}  // namespace ats
