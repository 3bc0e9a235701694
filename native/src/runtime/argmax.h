/* The greedy sampler's rule, shared with the forward pass that returns tokens instead of logits
 * (session_forward_tokens: on the GPU only the chosen ids come back). Defined in sampler.cpp. */
#pragma once
#include <stdint.h>

#include "ats/sampler.h"

namespace ats {

/* The first index of the largest of logits[0, V) (index 0 when none is larger than logits[0]). */
int32_t logits_argmax(const float *logits, int32_t V);

/* True when ats_sampler_sample(s, logits) is logits_argmax of the raw logits: temperature 0, no
 * logit bias, no presence or frequency penalty. */
bool sampler_takes_argmax(const ats_sampler *s);

}  // namespace ats
