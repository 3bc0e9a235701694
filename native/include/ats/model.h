/* ATS model runtime (C API): load a model directory (config.json + safetensors, float or
 * quantized), run forward passes over one or several sequences with a KV cache, and read logits.
 * No Python, no third-party libraries; every function reports bad input through err[err_cap]. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ats_model ats_model;
typedef struct ats_session ats_session;

typedef struct {
    const char *path;    /* model directory (config.json, model.safetensors[.index.json]) */
    int n_threads;       /* compute threads; 0 = all hardware threads, at most ats_threads_max() */
    const char *kernels; /* "auto" (NULL = auto), or a named set: "avx512", "avx2", "neon", "scalar" */
    const char *device;  /* "cpu" (NULL = cpu) or "cuda" (the current GPU; needs a build with
                            ATS_CUDA=ON): where weights, KV caches and forward passes live */
    const char *kv_cache; /* element type of every session's keys and values: "f32" (NULL = f32)
                             or "f16" (CPU only: half the cache's memory and of decode attention's
                             reads, each key and value rounded to half precision, |x| >= 65520
                             to inf; llama.cpp's default cache type) */
} ats_model_params;

/* 1 when this build holds the CUDA backend (device "cuda" can be asked for), else 0. */
int ats_cuda_built(void);

/* Loads and validates the model directory. Returns NULL with a message in err on any problem
 * (missing file or config key, malformed safetensors, wrong dtype/shape, missing tensor). */
ats_model *ats_model_init(const ats_model_params *params, char *err, size_t err_cap);
void ats_model_free(ats_model *model);

int32_t ats_model_vocab_size(const ats_model *model);
int32_t ats_model_max_seq_len(const ats_model *model);
/* config.json text as read (static for the model's lifetime). */
const char *ats_model_config_json(const ats_model *model);
/* Name of the kernel set in use ("avx512", "avx2", "neon", "scalar"; "cuda" on the GPU). */
const char *ats_model_kernels(const ats_model *model);
/* "cpu" or "cuda": where the model runs (ats_model_params.device). */
const char *ats_model_device(const ats_model *model);
/* "f32", "bf16", "int8" or "int4": how the weights were stored on disk. */
const char *ats_model_weight_format(const ats_model *model);
/* "f32" or "f16": the element type of its sessions' KV caches (ats_model_params.kv_cache). */
const char *ats_model_kv_cache(const ats_model *model);

/* Logits (n_seq, T, vocab) for n_seq fresh sequences of T tokens each (ids row-major n_seq x T).
 * Returns 0, or -1 with err set (token id out of range, T == 0, T > max_seq_len). */
int ats_model_logits(ats_model *model, const int32_t *ids, int32_t n_seq, int32_t T, float *out,
                     char *err, size_t err_cap);

/* A KV cache for n_seq sequences of up to max_len tokens each. */
ats_session *ats_session_init(ats_model *model, int32_t n_seq, int32_t max_len, char *err,
                              size_t err_cap);
void ats_session_free(ats_session *session);
/* Tokens already in the cache of sequence b. */
int32_t ats_session_length(const ats_session *session, int32_t b);
/* Empties sequence b (length 0, every cache slot invalid) so that a new sequence can use it; the
 * other sequences are untouched. Returns 0, or -1 with err set when b is out of range. */
int ats_session_reset(ats_session *session, int32_t b, char *err, size_t err_cap);

/* Appends n_new[b] tokens ids[b][0..n_new[b]) to every sequence b (0 = leave it alone) and runs
 * them through the model (a prompt may arrive in several calls: chunked prefill). Writes the logits of each sequence's last new token to
 * last_logits[b * vocab] (rows of sequences with n_new[b] == 0 are left untouched); with
 * all_logits != NULL also every new token's logits, sequence by sequence, in input order. */
int ats_session_forward(ats_session *session, const int32_t *const *ids, const int32_t *n_new,
                        float *last_logits, float *all_logits, char *err, size_t err_cap);

#ifdef __cplusplus
}
#endif
