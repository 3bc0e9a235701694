/* A byte-level BPE tokenizer read from a HF tokenizer.json as ats_tokenizer writes it (Split regex
 * pre-tokenizer with the gpt4 or gpt2 pattern + ByteLevel, BPE model, special added tokens), or an
 * HF ByteLevel(use_regex=true) file. Encoding is ats_tokenizer's encode_ordinary (special tokens
 * are not matched in text) through the BPE core of bpe_encoder.h. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ats/bpe_encoder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ats_tokenizer ats_tokenizer;

/* Reads and validates tokenizer.json; NULL with a message naming the field on any problem. */
ats_tokenizer *ats_tokenizer_init(const char *path, char *err, size_t err_cap);
void ats_tokenizer_free(ats_tokenizer *tok);

/* Number of ids (1 + the largest id of the vocabulary and the special tokens). */
int32_t ats_tokenizer_vocab_size(const ats_tokenizer *tok);

/* Appends the ids of UTF-8 text[0, len) to *out. Thread-safe. */
void ats_tokenizer_encode(const ats_tokenizer *tok, const char *text, size_t len, ats_ids *out);

/* The bytes of token `id` (*len of them), or NULL when id is not a token. */
const char *ats_tokenizer_id_bytes(const ats_tokenizer *tok, int32_t id, size_t *len);

#ifdef __cplusplus
}
#endif
