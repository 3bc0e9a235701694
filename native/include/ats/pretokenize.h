/* Pre-tokenization for the two named patterns ("gpt4" = cl100k, "gpt2"), hand-written to split
 * exactly like `regex.findall(PATTERN, text)` from the Python `regex` module (no regex engine). */
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ATS_PATTERN_GPT4 = 0, /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    ATS_PATTERN_GPT2 = 1, /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
} ats_pattern;

/* Parses a pattern name ("gpt4" or "gpt2") into *out. Returns 0 on success, -1 if unknown. */
int ats_pattern_from_name(const char *name, ats_pattern *out);

/* End (byte offset) of the pre-token that starts at byte `pos` of the UTF-8 `text` of `len` bytes;
 * pos < len. Split a whole text with: for (pos = 0; pos < len; pos = end) end = next(...).
 * Invalid UTF-8 bytes are read as single non-letter, non-number, non-space characters. */
size_t ats_pretokenize_next(ats_pattern pattern, const char *text, size_t len, size_t pos);

#ifdef __cplusplus
}
#endif
