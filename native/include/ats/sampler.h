/* Token sampling from logits (C API): logit bias and presence/frequency penalties (OpenAI's
 * definitions, over the tokens this sampler has accepted), then greedy (temperature 0), or
 * temperature, then top-k, then top-p (nucleus, Holtzman et al. 2019), then a draw from a seeded
 * generator, the order ats_model.generate and HF transformers use. The same seed gives the same
 * tokens. */
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
    float presence_penalty;  /* subtracted once from every token accepted so far; 0 = off */
    float frequency_penalty; /* subtracted per time a token was accepted so far; 0 = off */
} ats_sampler_params;

/* Returns NULL with a message in err for temperature < 0, top_k < 0, top_p outside (0, 1],
 * a penalty that is not finite. */
ats_sampler *ats_sampler_init(const ats_sampler_params *params, int32_t vocab_size, char *err,
                              size_t err_cap);
void ats_sampler_free(ats_sampler *sampler);

/* Adds bias[i] to the logit of token ids[i] before every draw (replacing any earlier bias).
 * Returns 0, or -1 with err set for an id outside [0, vocab_size) or a non-finite bias. */
int ats_sampler_set_logit_bias(ats_sampler *sampler, const int32_t *ids, const float *bias,
                               int32_t n, char *err, size_t err_cap);

/* Draws one token id from logits[vocab_size]. Not thread-safe on one sampler. */
int32_t ats_sampler_sample(ats_sampler *sampler, const float *logits);

/* Records token as generated: the penalties of later draws count it. */
void ats_sampler_accept(ats_sampler *sampler, int32_t token);

#ifdef __cplusplus
}
#endif
