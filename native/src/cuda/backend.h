/* The CUDA backend behind the model runtime's C API (include/ats/model.h): a model loaded with
 * device "cuda" uploads its weights once (CudaModel), its sessions keep the KV cache on the GPU
 * (CudaSession), and ats_session_forward runs there. Plain C++ on this side (no CUDA headers):
 * builds without ATS_CUDA link backend_none.cpp, whose init fails with a clear message. */
#pragma once
#include <stdint.h>

#include <string>

struct ats_model;
struct ats_session;

namespace ats {

struct CudaModel;
struct CudaSession;

/* True when this build holds the CUDA backend (ATS_CUDA=ON). */
bool cuda_built();

/* Uploads the loaded model m (weights, RoPE tables) to the current GPU into *out. False with
 * *err set: no CUDA in this build, no device, a family or layout the backend does not run, or
 * out of GPU memory. */
bool cuda_model_init(const ats_model *m, CudaModel **out, std::string *err);
void cuda_model_free(CudaModel *cm);

/* The GPU KV cache of session s (s->model->cuda set, n_seq and max_len filled in). */
bool cuda_session_init(ats_session *s, CudaSession **out, std::string *err);
void cuda_session_free(CudaSession *cs);
/* Marks every cache slot of sequence b invalid (ats_session_reset). */
void cuda_session_reset(ats_session *s, int32_t b);

/* session_forward_tokens (forward.h) on the GPU: same arguments, all checks done by the caller;
 * with last_tokens the argmax runs on the GPU and only the ids are copied back (besides any
 * logits asked for). False with *err set on a CUDA error (out of memory, a failed launch). */
bool cuda_session_forward(ats_session *s, const int32_t *const *ids, const int32_t *n_new,
                          float *last_logits, float *all_logits, int32_t *last_tokens,
                          std::string *err);

}  // namespace ats
