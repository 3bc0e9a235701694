/* Byte-level BPE encoder: pre-tokenize (a named pattern), then merge each pre-token's byte ids by
 * lowest merge rank (leftmost on ties), HF `tokenizers` semantics, valid for any id assignment. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ats/pretokenize.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ats_bpe_encoder ats_bpe_encoder;

typedef struct {
    const int32_t *byte_ids; /* 256 ids: byte_ids[b] is the id of the one-byte token b */
    const int32_t *merges;   /* n_merges rows of (left_id, right_id, merged_id); row index = rank */
    size_t n_merges;         /* number of rows in merges */
    ats_pattern pattern;     /* pre-tokenization pattern */
} ats_bpe_encoder_params;

/* A growable array of token ids; zero-initialize it, release it with ats_ids_free. */
typedef struct {
    int32_t *data; /* malloc'd ids */
    size_t len;    /* ids in use */
    size_t cap;    /* ids allocated */
} ats_ids;

void ats_ids_free(ats_ids *ids);

/* Validates params (distinct non-negative byte ids; merge parts are byte ids or made by an earlier
 * merge; merged ids new and distinct; no repeated pair). Returns NULL and writes a message into err[err_cap] when invalid. */
ats_bpe_encoder *ats_bpe_encoder_init(const ats_bpe_encoder_params *params, char *err,
                                      size_t err_cap);
void ats_bpe_encoder_free(ats_bpe_encoder *enc);

/* Appends the ids of the UTF-8 `text` (len bytes) to *out. Thread-safe on a shared encoder. */
void ats_bpe_encoder_encode(const ats_bpe_encoder *enc, const char *text, size_t len, ats_ids *out);

/* Encodes texts[i] (lens[i] bytes) into outs[i] for i < n on n_threads threads (0 = all hardware
 * threads, at most ats_threads_max(): ats/threads.h). Returns 0, or -1 with err set on a bad
 * thread count or a thread the system refused (outs may then hold some texts' ids: the caller
 * frees them as usual). */
int ats_bpe_encoder_encode_batch(const ats_bpe_encoder *enc, const char *const *texts,
                                 const size_t *lens, size_t n, int n_threads, ats_ids *outs,
                                 char *err, size_t err_cap);

#ifdef __cplusplus
}
#endif
