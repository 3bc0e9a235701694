/* The GPU side of an ats_session (session_cuda.cu), shared with the MoE FFN (moe_cuda.cu). */
#pragma once
#include <map>
#include <string>
#include <vector>

#include "../runtime/forward.h"
#include "kernels.cuh"
#include "model_cuda.h"

namespace ats {

/* Device buffers sized for M rows (and R output rows) of one forward call. */
struct Scratch {
    int64_t M = 0, R = 0;
    /* x: the residual stream (the block's adds happen in place); qkv (M, H + 2 KV): q | k | v
     * per row; gu (M, 2F): gate | up per row; g, u: (M, F) */
    float *x, *hn, *f, *qkv, *att, *gu, *g, *u, *xs, *hs, *logits;
    int8_t *xq; /* quantized activations: (M * max(1, top_k), max(C, H, F, shared width)) */
    float *xd;
    int32_t *tok, *seq, *pos, *out_rows; /* one allocation of 4 x M, in this order */
    int32_t *amax;                       /* (R) argmax of each output row's logits */
    unsigned long long *amax_keys;       /* (R, gpu_argmax_parts(V)) the argmax's chunk keys */
    float *att_part;                     /* gpu_attention_part_floats(M, ...): its key splits */
    /* MoE: router logits (M, E); expert rows sorted by expert (M * K, C) in, their gate/up
     * (M * K, F), their outputs (M * K, C); shared experts' output (M, C); the token of each
     * sorted row, the sorted row of each (token, choice) slot (-1 dropped) and its weight */
    float *rl, *xe, *ge, *ue, *ys, *shared, *mwts;
    int32_t *mrows, *mslot;
};

struct CudaSession {
    cudaStream_t stream = nullptr;
    std::vector<GpuKV> kv;
    std::vector<void *> cache_allocs, scratch_allocs;
    Scratch s;
    std::vector<int32_t> upload;               /* host side of s.tok's buffer */
    bool graphs = true;                        /* decode steps replay captured graphs */
    bool pdl = true;                           /* their kernels launched with PDL */
    bool mma = true;                           /* N > 1 int8 / int4 matmuls on tensor cores */
    std::map<int64_t, cudaGraphExec_t> decode; /* by row count; valid while scratch stays */
    void drop_graphs() {
        for (auto &g : decode) cudaGraphExecDestroy(g.second);
        decode.clear();
    }
    ~CudaSession() {
        drop_graphs();
        for (void *p : cache_allocs) cudaFree(p);
        for (void *p : scratch_allocs) cudaFree(p);
        if (stream) cudaStreamDestroy(stream);
    }
};

inline bool quantized(const GpuWeight &w) { return w.type == GPU_Q8 || w.type == GPU_Q4; }

/* y = x @ w^T (+ res), quantizing x first when w is int8 / int4. */
inline void linear(const GpuWeight &w, const float *x, const Scratch &s, int64_t N, float *y,
                   cudaStream_t st, const float *res = nullptr) {
    const GpuQAct xq{s.xq, s.xd};
    if (quantized(w)) gpu_quantize(x, N, w.cols, xq, st);
    gpu_matmul(w, x, xq, N, y, st, res);
}

/* The quantized-activation buffers when w takes Q8_0 input, else none (xq.q NULL): where a
 * kernel quantizes its own output for the next matmul. */
inline GpuQAct qact_for(const GpuWeight &w, const Scratch &s) {
    return quantized(w) ? GpuQAct{s.xq, s.xd} : GpuQAct{nullptr, nullptr};
}

/* The MoE FFN of layer li on the GPU: s.f (M, C) from s.hn (M, C). Routing runs on the host
 * (moe_route, the CPU's rules) on router logits copied back, so the step syncs once per MoE
 * layer and is never captured in a graph. False with *err set on a CUDA error. */
bool moe_ffn_gpu(const ats_model *m, CudaSession *cs, int64_t li, int64_t M, std::string *err);

}  // namespace ats
