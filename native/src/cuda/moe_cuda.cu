/* The MoE FFN on the GPU (moe.cpp's math): router logits on the GPU, routing on the host with
 * the CPU's own moe_route (softmax with temperature, top-k by probability + expert_bias,
 * norm_topk, capacity), then the chosen rows gathered and sorted by expert, each expert's
 * SwiGLU over its rows (activations quantized once for all experts on int8 / int4 weights), the
 * shared experts over every row, and the weighted sum in choice order. */
#include <vector>

#include "session_cuda.h"

namespace ats {

bool moe_ffn_gpu(const ats_model *m, CudaSession *cs, int64_t li, int64_t M, std::string *err) {
    const Config &c = m->cfg;
    const Layer &L = m->layers[(size_t)li];
    const GpuLayer &G = m->cuda->layers[(size_t)li];
    const Scratch &s = cs->s;
    cudaStream_t st = cs->stream;
    const int64_t E = c.n_experts, K = c.top_k, C = c.dim, F = c.ffn_dim;

    thread_local std::vector<float> logits, wts;
    thread_local std::vector<int32_t> idx, rows, slot, start;
    thread_local std::vector<uint8_t> keep;
    logits.resize((size_t)(M * E));
    linear(G.router, s.hn, s, M, s.rl, st);
    CUDA_TRY(cudaMemcpyAsync(logits.data(), s.rl, (size_t)(M * E) * sizeof(float),
                             cudaMemcpyDeviceToHost, st),
             "router logits");
    CUDA_TRY(cudaStreamSynchronize(st), "router logits");
    idx.resize((size_t)(M * K));
    wts.resize((size_t)(M * K));
    keep.resize((size_t)(M * K));
    moe_route(c, L, logits.data(), M, idx.data(), wts.data(), keep.data());

    /* kept slots sorted by expert: rows[i] = token of sorted row i; slot[n * K + j] = its row */
    rows.clear();
    slot.assign((size_t)(M * K), -1);
    start.assign((size_t)E + 1, 0);
    for (int64_t e = 0; e < E; e++) {
        start[(size_t)e] = (int32_t)rows.size();
        for (int64_t sl = 0; sl < M * K; sl++) {
            if (idx[(size_t)sl] == e && keep[(size_t)sl]) {
                slot[(size_t)sl] = (int32_t)rows.size();
                rows.push_back((int32_t)(sl / K));
            }
        }
    }
    start[(size_t)E] = (int32_t)rows.size();
    const int64_t n_rows = (int64_t)rows.size();
    /* pageable host sources: each copy has read them when it returns */
    CUDA_TRY(cudaMemcpyAsync(s.mslot, slot.data(), (size_t)(M * K) * 4, cudaMemcpyHostToDevice,
                             st),
             "MoE routing upload");
    CUDA_TRY(cudaMemcpyAsync(s.mwts, wts.data(), (size_t)(M * K) * 4, cudaMemcpyHostToDevice, st),
             "MoE routing upload");
    if (n_rows > 0) {
        CUDA_TRY(cudaMemcpyAsync(s.mrows, rows.data(), (size_t)n_rows * 4,
                                 cudaMemcpyHostToDevice, st),
                 "MoE routing upload");
        gpu_gather_rows(s.hn, s.mrows, n_rows, C, s.xe, st);
        const bool q = quantized(G.ew1[0]);
        if (q) gpu_quantize(s.xe, n_rows, C, GpuQAct{s.xq, s.xd}, st);
        for (int64_t e = 0; e < E; e++) {
            const int64_t r0 = start[(size_t)e], ne = start[(size_t)e + 1] - r0;
            if (ne == 0) continue;
            const GpuQAct xq{s.xq + r0 * C, s.xd + r0 * C / 32};
            gpu_matmul(G.ew1[(size_t)e], s.xe + r0 * C, xq, ne, s.ge + r0 * F, st);
            gpu_matmul(G.ew3[(size_t)e], s.xe + r0 * C, xq, ne, s.ue + r0 * F, st);
        }
        gpu_silu_mul(s.ge, s.ue, n_rows, F, F, s.ge,
                     q ? GpuQAct{s.xq, s.xd} : GpuQAct{nullptr, nullptr}, st);
        for (int64_t e = 0; e < E; e++) {
            const int64_t r0 = start[(size_t)e], ne = start[(size_t)e + 1] - r0;
            if (ne == 0) continue;
            const GpuQAct xq{s.xq + r0 * F, s.xd + r0 * F / 32};
            gpu_matmul(G.ew2[(size_t)e], s.ge + r0 * F, xq, ne, s.ys + r0 * C, st);
        }
    }
    if (G.has_shared) {
        linear(G.sw1, s.hn, s, M, s.g, st);
        linear(G.sw3, s.hn, s, M, s.u, st);
        const int64_t S = G.sw1.rows;
        gpu_silu_mul(s.g, s.u, M, S, S, s.g, qact_for(G.sw2, s), st);
        gpu_matmul(G.sw2, s.g, GpuQAct{s.xq, s.xd}, M, s.shared, st);
    }
    gpu_moe_combine(s.ys, s.mslot, s.mwts, G.has_shared ? s.shared : nullptr, M, K, C, s.f, st);
    return true;
}

}  // namespace ats
