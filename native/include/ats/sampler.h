/* Token sampling from logits (C API): greedy (temperature 0), or temperature, then top-k, then
 * top-p (nucleus, Holtzman et al. 2019), then a draw from a seeded generator, the order
 * ats_model.generate and HF transformers use. The same seed gives the same tokens. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ats_sampler ats_sampler;

typedef struct {
    float temperature; /* 0 = greedy (argmax, first maximum); > 0 divides the logits */
    int32_t top_k;     /* keep the k largest logits; 0 = off */
    float top_p;       /* keep the smallest set whose probability reaches top_p; 1 = off */
    uint64_t seed;     /* generator seed (splitmix64 stream) */
} ats_sampler_params;

/* Returns NULL with a message in err for temperature < 0, top_k < 0, top_p outside (0, 1]. */
ats_sampler *ats_sampler_init(const ats_sampler_params *params, int32_t vocab_size, char *err,
                              size_t err_cap);
void ats_sampler_free(ats_sampler *sampler);

/* Draws one token id from logits[vocab_size]. Not thread-safe on one sampler. */
int32_t ats_sampler_sample(ats_sampler *sampler, const float *logits);

#ifdef __cplusplus
}
#endif
