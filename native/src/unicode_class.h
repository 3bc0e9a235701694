/* Code point decoding and the character classes of the pre-tokenizer (\p{L}, \p{N}, \s), read from
 * the tables generated out of the `regex` module (unicode_tables.h). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "unicode_tables.h"

enum { UCLASS_OTHER = 0, UCLASS_LETTER = 1, UCLASS_NUMBER = 2, UCLASS_SPACE = 3 };

/* Decodes the code point at s[pos] (pos < len) and stores the offset just after it in *next.
 * A malformed or truncated sequence reads as U+FFFD spanning one byte, so a scan never stalls. */
static inline uint32_t utf8_decode(const unsigned char *s, size_t len, size_t pos, size_t *next) {
    uint32_t b0 = s[pos];
    if (b0 < 0x80) {
        *next = pos + 1;
        return b0;
    }
    size_t n = 0;
    uint32_t cp = 0;
    uint32_t min = 0;
    if ((b0 & 0xE0) == 0xC0) {
        n = 2; cp = b0 & 0x1F; min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
        n = 3; cp = b0 & 0x0F; min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
        n = 4; cp = b0 & 0x07; min = 0x10000;
    }
    if (n == 0 || pos + n > len) {
        *next = pos + 1;
        return 0xFFFD;
    }
    for (size_t i = 1; i < n; i++) {
        uint32_t b = s[pos + i];
        if ((b & 0xC0) != 0x80) {
            *next = pos + 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF) {
        *next = pos + 1;
        return 0xFFFD;
    }
    *next = pos + n;
    return cp;
}

static inline int uclass(uint32_t cp) {
    return ats_unicode_stage2[ats_unicode_stage1[cp >> ATS_UNICODE_BLOCK_SHIFT]]
                             [cp & ((1u << ATS_UNICODE_BLOCK_SHIFT) - 1)];
}
