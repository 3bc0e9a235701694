/* Hand-written matchers for the "gpt4" and "gpt2" pre-tokenization patterns. Each function below
 * tries the pattern's alternatives in order at one position, with the same backtracking result as
 * the `regex` module (see the comments at each alternative). */
#include "ats/pretokenize.h"

#include <string.h>

#include "unicode_class.h"

#define FOLD_LEN(arr) (sizeof(arr) / sizeof((arr)[0]))

typedef const unsigned char *bytes_t;

int ats_pattern_from_name(const char *name, ats_pattern *out) {
    if (strcmp(name, "gpt4") == 0) {
        *out = ATS_PATTERN_GPT4;
        return 0;
    }
    if (strcmp(name, "gpt2") == 0) {
        *out = ATS_PATTERN_GPT2;
        return 0;
    }
    return -1;
}

static int in_set(uint32_t cp, const uint32_t *set, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (set[i] == cp) return 1;
    }
    return 0;
}

/* Does the code point at pos match contraction letter `letter`? Stores the offset after it. */
static int letter_at(bytes_t s, size_t len, size_t pos, char letter, int fold, size_t *next) {
    if (pos >= len) return 0;
    uint32_t cp = utf8_decode(s, len, pos, next);
    if (!fold) return cp == (uint32_t)letter;
    switch (letter) {
        case 's': return in_set(cp, ats_unicode_fold_s, FOLD_LEN(ats_unicode_fold_s));
        case 't': return in_set(cp, ats_unicode_fold_t, FOLD_LEN(ats_unicode_fold_t));
        case 'r': return in_set(cp, ats_unicode_fold_r, FOLD_LEN(ats_unicode_fold_r));
        case 'e': return in_set(cp, ats_unicode_fold_e, FOLD_LEN(ats_unicode_fold_e));
        case 'v': return in_set(cp, ats_unicode_fold_v, FOLD_LEN(ats_unicode_fold_v));
        case 'm': return in_set(cp, ats_unicode_fold_m, FOLD_LEN(ats_unicode_fold_m));
        case 'l': return in_set(cp, ats_unicode_fold_l, FOLD_LEN(ats_unicode_fold_l));
        case 'd': return in_set(cp, ats_unicode_fold_d, FOLD_LEN(ats_unicode_fold_d));
        default: return 0;
    }
}

/* 's|'t|'re|'ve|'m|'ll|'d after the apostrophe at pos - 1: end offset, or 0 if none matches.
 * The alternatives start with distinct letters, so trying them in order reduces to one branch. */
static size_t contraction_end(bytes_t s, size_t len, size_t pos, int fold) {
    static const char *const alts[7] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (int a = 0; a < 7; a++) {
        size_t p = pos;
        const char *alt = alts[a];
        int ok = 1;
        for (size_t k = 0; alt[k] != 0; k++) {
            size_t next = p;
            if (!letter_at(s, len, p, alt[k], fold, &next)) {
                ok = 0;
                break;
            }
            p = next;
        }
        if (ok) return p;
    }
    return 0;
}

/* End of the longest run of code points of class `cls` starting at pos (at most `max` of them). */
static size_t run_end(bytes_t s, size_t len, size_t pos, int cls, size_t max) {
    size_t count = 0;
    while (pos < len && count < max) {
        size_t next;
        uint32_t cp = utf8_decode(s, len, pos, &next);
        if (uclass(cp) != cls) break;
        pos = next;
        count++;
    }
    return pos;
}

static size_t newlines_end(bytes_t s, size_t len, size_t pos) {
    while (pos < len && (s[pos] == '\r' || s[pos] == '\n')) pos++;
    return pos;
}

/* \s+(?!\S) then \s+ on the whitespace run starting at pos: the whole run if it reaches the end of
 * the text, else the run minus its last code point (which then leads the next pre-token) when that
 * leaves at least one, else the whole run. gpt4's \s*[\r\n]+ is handled by the caller. */
static size_t space_end(bytes_t s, size_t len, size_t pos, size_t *last_newline_end) {
    size_t last_start = pos;
    size_t count = 0;
    *last_newline_end = 0;
    while (pos < len) {
        size_t next;
        uint32_t cp = utf8_decode(s, len, pos, &next);
        if (uclass(cp) != UCLASS_SPACE) break;
        if (cp == '\r' || cp == '\n') *last_newline_end = next;
        last_start = pos;
        pos = next;
        count++;
    }
    if (pos == len || count < 2) return pos;
    return last_start;
}

static size_t next_gpt4(bytes_t s, size_t len, size_t pos) {
    size_t p1;
    uint32_t cp0 = utf8_decode(s, len, pos, &p1);
    int c0 = uclass(cp0);
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (cp0 == '\'') {
        size_t end = contraction_end(s, len, p1, 1);
        if (end) return end;
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ : with the optional char if the next one is a letter, else only
     * from a letter (a skipped optional char that is not a letter cannot start \p{L}+). */
    if (c0 == UCLASS_LETTER) return run_end(s, len, p1, UCLASS_LETTER, (size_t)-1);
    if (c0 != UCLASS_NUMBER && cp0 != '\r' && cp0 != '\n' && p1 < len) {
        size_t p2;
        uint32_t cp1 = utf8_decode(s, len, p1, &p2);
        if (uclass(cp1) == UCLASS_LETTER) return run_end(s, len, p2, UCLASS_LETTER, (size_t)-1);
    }
    /* \p{N}{1,3} */
    if (c0 == UCLASS_NUMBER) return run_end(s, len, p1, UCLASS_NUMBER, 2);
    /* ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
    if (cp0 == ' ' && p1 < len) {
        size_t p2;
        uint32_t cp1 = utf8_decode(s, len, p1, &p2);
        if (uclass(cp1) == UCLASS_OTHER) {
            return newlines_end(s, len, run_end(s, len, p2, UCLASS_OTHER, (size_t)-1));
        }
    }
    if (c0 == UCLASS_OTHER) {
        return newlines_end(s, len, run_end(s, len, p1, UCLASS_OTHER, (size_t)-1));
    }
    /* c0 is whitespace. \s*[\r\n]+ : \s* backs off to the last newline of the run, and [\r\n]+
     * then takes just that one; otherwise \s+(?!\S) and \s+. */
    size_t last_newline_end;
    size_t end = space_end(s, len, pos, &last_newline_end);
    if (last_newline_end) return last_newline_end;
    return end;
}

static size_t next_gpt2(bytes_t s, size_t len, size_t pos) {
    size_t p1;
    uint32_t cp0 = utf8_decode(s, len, pos, &p1);
    int c0 = uclass(cp0);
    /* 's|'t|'re|'ve|'m|'ll|'d (case-sensitive) */
    if (cp0 == '\'') {
        size_t end = contraction_end(s, len, p1, 0);
        if (end) return end;
    }
    /* ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+` : a leading space joins the run of the next class */
    if (cp0 == ' ' && p1 < len) {
        size_t p2;
        uint32_t cp1 = utf8_decode(s, len, p1, &p2);
        int c1 = uclass(cp1);
        if (c1 != UCLASS_SPACE) return run_end(s, len, p2, c1, (size_t)-1);
    }
    if (c0 != UCLASS_SPACE) return run_end(s, len, p1, c0, (size_t)-1);
    /* \s+(?!\S) and \s+ */
    size_t last_newline_end;
    return space_end(s, len, pos, &last_newline_end);
}

size_t ats_pretokenize_next(ats_pattern pattern, const char *text, size_t len, size_t pos) {
    bytes_t s = (bytes_t)text;
    if (pattern == ATS_PATTERN_GPT2) return next_gpt2(s, len, pos);
    return next_gpt4(s, len, pos);
}
