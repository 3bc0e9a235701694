/* The GPU copy of a model (model_cuda.cu uploads it; session_cuda.cu runs it). */
#pragma once
#include <string>
#include <vector>

#include "kernels.cuh"

/* On a CUDA error: *err = "device 'cuda': what: <CUDA's message>", return false. */
#define CUDA_TRY(call, what)                                                                   \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            *err = std::string("device 'cuda': ") + (what) + ": " + cudaGetErrorString(e_);    \
            return false;                                                                      \
        }                                                                                      \
    } while (0)

namespace ats {

struct GpuLayer {
    const float *attn_norm, *ffn_norm;
    GpuWeight wqkv, wo;                      /* wqkv: wq | wk | wv rows (one launch) */
    GpuWeight w13, w2;                       /* the dense FFN; w13: w1 | w3 rows */
    GpuWeight router;                        /* MoE: (E, C); routing itself runs on the host */
    std::vector<GpuWeight> ew1, ew2, ew3;    /* MoE: one per expert */
    bool has_shared = false;
    GpuWeight sw1, sw2, sw3;                 /* MoE: shared experts fused */
};

struct CudaModel {
    std::vector<void *> allocs;
    std::vector<GpuLayer> layers;
    const void *emb = nullptr;
    bool emb_bf16 = false;
    const float *norm = nullptr;
    GpuWeight output;
    const float *cos_t = nullptr, *sin_t = nullptr;
    ~CudaModel() {
        for (void *p : allocs) cudaFree(p);
    }
};

}  // namespace ats
