/* Streaming pre-token counts for BPE training: pre-tokenize texts (a named pattern) on several
 * threads and count each pre-token's UTF-8 bytes; prune rare words to bound memory. Calls on one
 * counter may come from several threads: they are serialized. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ats/pretokenize.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ats_word_counter ats_word_counter;

ats_word_counter *ats_word_counter_init(ats_pattern pattern);
void ats_word_counter_free(ats_word_counter *wc);

/* Pre-tokenizes texts[i] (UTF-8, lens[i] bytes) for i < n on n_threads threads (0 = all hardware
 * threads, at most ats_threads_max(): ats/threads.h) and adds one count per pre-token.
 * Per-thread counts are summed, so the result does not depend on the thread count. Returns 0, or
 * -1 with err set (and nothing added) on a bad thread count or a thread the system refused. */
int ats_word_counter_add(ats_word_counter *wc, const char *const *texts, const size_t *lens,
                         size_t n, int n_threads, char *err, size_t err_cap);

/* Adds `count` to the word of `len` bytes. */
void ats_word_counter_insert(ats_word_counter *wc, const char *word, size_t len, int64_t count);

/* If more than max_words words are held, drops every word with count <= t for the smallest
 * t = 1, 2, 3, ... that leaves at most max_words. */
void ats_word_counter_prune(ats_word_counter *wc, size_t max_words);

size_t ats_word_counter_size(const ats_word_counter *wc);

/* Calls fn(ctx, word, len, count) once per word, in no particular order; fn must not call back
 * into the same counter. */
typedef void (*ats_word_visit_fn)(void *ctx, const char *word, size_t len, int64_t count);
void ats_word_counter_foreach(const ats_word_counter *wc, ats_word_visit_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
