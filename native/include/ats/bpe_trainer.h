/* BPE training on word counts: repeatedly merge the pair with the highest total count (ties: the
 * smallest (left, right)), incrementally, as HF `tokenizers` and minbpe count pairs. Byte b has id b;
 * the i-th merge creates id 256 + i. Deterministic. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ats/word_counter.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t n_merges;       /* most merges to learn */
    int64_t min_frequency; /* stop once the best pair's total count is below this */
} ats_bpe_train_params;

/* Learns merges from the words of wc; writes (left, right) of merge i to merges_out[2i], [2i+1]
 * (room for 2 * n_merges ids) and returns the number of merges learned. */
size_t ats_bpe_train(const ats_word_counter *wc, const ats_bpe_train_params *params,
                     int32_t *merges_out);

#ifdef __cplusplus
}
#endif
