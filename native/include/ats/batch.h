/* Continuous batching (C API): a session of n_slots sequences, each running its own request
 * (prompt, sampler, stop tokens, token budget). Requests start in a free slot and leave it when
 * they finish or are cancelled, between steps; one ats_batch_step runs one forward pass over every
 * busy slot: a prompt chunk for slots still in prefill, the last sampled token for the others,
 * then samples the next token of each slot whose prompt is complete. Not thread-safe: one thread
 * owns a batch. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ats/model.h"
#include "ats/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ats_batch ats_batch;

#define ATS_MAX_TOP_LOGPROBS 20

enum {
    ATS_FINISH_NONE = 0,   /* the slot keeps generating */
    ATS_FINISH_STOP = 1,   /* the token is one of the request's stop tokens (not part of the text) */
    ATS_FINISH_LENGTH = 2, /* max_new_tokens produced, or the slot's cache is full */
};

typedef struct {
    int32_t max_new_tokens;     /* >= 1 */
    const int32_t *stop_tokens; /* ending the request when sampled; may be NULL with n_stop 0 */
    int32_t n_stop;
    int32_t logprobs;     /* 1: report the log-probability of each sampled token */
    int32_t top_logprobs; /* 0..ATS_MAX_TOP_LOGPROBS alternatives per token (needs logprobs) */
    int32_t vocab_limit;  /* 1..vocab_size: only ids below it are drawn, argmaxed and reported in
                           * logprobs (a vocabulary padded past the tokenizer's ids); 0 = all */
} ats_request_params;

/* One sampled token of one slot. Log-probabilities are log-softmax of the model's raw logits
 * (before bias, penalties and temperature; over the ids below the request's vocab_limit), as vLLM
 * reports them. */
typedef struct {
    int32_t slot;
    int32_t token;
    int32_t finish; /* ATS_FINISH_*; != NONE: the slot is free again */
    float logprob;
    int32_t n_top;
    int32_t top_ids[ATS_MAX_TOP_LOGPROBS]; /* most likely first */
    float top_logprobs[ATS_MAX_TOP_LOGPROBS];
} ats_batch_event;

/* n_slots sequences of up to max_len tokens (prompt + generated) each. */
ats_batch *ats_batch_init(ats_model *model, int32_t n_slots, int32_t max_len, char *err,
                          size_t err_cap);
void ats_batch_free(ats_batch *batch);
int32_t ats_batch_n_slots(const ats_batch *batch);
/* 1 when a request runs in slot, 0 when it is free (or out of range). */
int32_t ats_batch_busy(const ats_batch *batch, int32_t slot);

/* Starts a request in a free slot. logit_bias: n_bias pairs (bias_ids[i], bias[i]), ids below the
 * request's vocab_limit. Returns 0, or -1 with err set (slot busy or out of range, empty prompt,
 * prompt + 1 > max_len, token id out of range, bad sampler parameters or request parameters). */
int ats_batch_start(ats_batch *batch, int32_t slot, const int32_t *prompt, int32_t n_prompt,
                    const ats_sampler_params *sampling, const int32_t *bias_ids,
                    const float *bias, int32_t n_bias, const ats_request_params *request,
                    char *err, size_t err_cap);

/* Ends the request in slot (if any) and frees the slot. */
void ats_batch_cancel(ats_batch *batch, int32_t slot);

/* One forward pass over every busy slot. Prefilling slots take up to prefill_budget prompt tokens
 * in all (0 = no limit), in slot order, so that a long prompt does not stall the decoding slots.
 * Writes one event per slot that sampled a token to events[0..*n_events) (capacity n_slots).
 * Returns 0 (also when no slot is busy: *n_events = 0), or -1 with err set. */
int ats_batch_step(ats_batch *batch, int32_t prefill_budget, ats_batch_event *events,
                   int32_t *n_events, char *err, size_t err_cap);

#ifdef __cplusplus
}
#endif
