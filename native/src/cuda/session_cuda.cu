/* The GPU side of an ats_session: per-layer KV cache and validity on the GPU, scratch that
 * grows with the largest call, one stream; and the forward pass over the new tokens of all
 * sequences (rows stacked as in forward.cpp), logits (or, for greedy sampling, the argmax ids)
 * copied back to the host. A decode step (one
 * token per sequence) replays a CUDA graph captured once per row count (its kernels read the
 * rows' tokens, sequences and positions from device buffers filled before each replay, and
 * attention sizes its shared memory for the session's max_len): a small model's step is
 * hundreds of short kernels, whose launches would otherwise dominate. ATS_CUDA_GRAPHS=0 turns
 * the graphs off (every step launches its kernels). The graph's kernels are launched with
 * programmatic dependent launch (kernels.cuh: pdl_sync), so each kernel's blocks are placed
 * while the one before it drains; ATS_CUDA_PDL=0 captures them without. ATS_CUDA_MMA=0 runs
 * the int8 / int4 matmuls of several rows on the warp kernel instead of the tensor cores (the
 * same outputs, bit for bit: a check and a benchmark baseline). */
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../runtime/forward.h"
#include "backend.h"
#include "kernels.cuh"
#include "model_cuda.h"
#include "session_cuda.h"

namespace ats {

namespace {

bool alloc(std::vector<void *> *allocs, size_t bytes, void *out, std::string *err) {
    void *d = nullptr;
    CUDA_TRY(cudaMalloc(&d, std::max<size_t>(bytes, 16)), "out of GPU memory");
    allocs->push_back(d);
    *(void **)out = d;
    return true;
}

/* Grows the scratch to hold M rows and R output rows (powers of two, so a growing prompt
 * reallocates rarely). */
bool scratch_reserve(CudaSession *cs, const Config &c, int64_t M, int64_t R, std::string *err) {
    Scratch &s = cs->s;
    if (M <= s.M && R <= s.R) return true;
    CUDA_TRY(cudaStreamSynchronize(cs->stream), "forward pass");
    cs->drop_graphs(); /* they hold the old buffers' addresses */
    for (void *p : cs->scratch_allocs) cudaFree(p);
    cs->scratch_allocs.clear();
    int64_t m = 1, r = 1;
    while (m < M) m *= 2;
    while (r < R) r *= 2;
    s.M = m;
    s.R = r;
    const int64_t C = c.dim, H = c.n_head * c.head_dim, KV = c.n_kv_head * c.head_dim,
                  V = c.vocab_size, E = c.has_moe ? c.n_experts : 1,
                  K = c.has_moe ? c.top_k : 1, S = c.has_moe ? c.n_shared_experts * c.ffn_dim : 0,
                  F = std::max(c.ffn_dim, S), W = std::max({C, H, F});
    std::vector<void *> *A = &cs->scratch_allocs;
    const size_t f4 = sizeof(float);
    const bool ok =
        alloc(A, m * C * f4, &s.x, err) && alloc(A, m * C * f4, &s.hn, err) &&
        alloc(A, m * C * f4, &s.f, err) && alloc(A, m * (H + 2 * KV) * f4, &s.qkv, err) &&
        alloc(A, m * H * f4, &s.att, err) && alloc(A, m * 2 * F * f4, &s.gu, err) &&
        alloc(A, m * F * f4, &s.g, err) && alloc(A, m * F * f4, &s.u, err) &&
        alloc(A, r * C * f4, &s.xs, err) && alloc(A, r * C * f4, &s.hs, err) &&
        alloc(A, r * V * f4, &s.logits, err) && alloc(A, r * 4, &s.amax, err) &&
        alloc(A, r * gpu_argmax_parts(V) * 8, &s.amax_keys, err) &&
        alloc(A, gpu_attention_part_floats(m, c.n_head, c.head_dim) * f4, &s.att_part, err) &&
        alloc(A, m * K * W, &s.xq, err) && alloc(A, m * K * W / 32 * f4, &s.xd, err) &&
        alloc(A, 4 * m * 4, &s.tok, err) &&
        alloc(A, m * E * f4, &s.rl, err) && alloc(A, m * K * C * f4, &s.xe, err) &&
        alloc(A, m * K * F * f4, &s.ge, err) && alloc(A, m * K * F * f4, &s.ue, err) &&
        alloc(A, m * K * C * f4, &s.ys, err) && alloc(A, m * C * f4, &s.shared, err) &&
        alloc(A, m * K * f4, &s.mwts, err) && alloc(A, m * K * 4, &s.mrows, err) &&
        alloc(A, m * K * 4, &s.mslot, err);
    if (!ok) return false;
    s.seq = s.tok + m; /* tok, seq, pos, out_rows: one buffer, one upload per call */
    s.pos = s.tok + 2 * m;
    s.out_rows = s.tok + 3 * m;
    return true;
}

/* Every kernel of one forward call over the M rows in the scratch buffers (tokens, sequences,
 * positions, output rows uploaded), up to the logits of the R output rows. max_pos bounds the
 * rows' positions (attention's shared memory). */
bool run_kernels(const ats_model *m, CudaSession *cs, int64_t M, int64_t R, int64_t max_pos,
                 std::string *err) {
    const CudaModel *cm = m->cuda;
    const Config &c = m->cfg;
    const int64_t C = c.dim, NH = c.n_head, NKV = c.n_kv_head, hd = c.head_dim, F = c.ffn_dim;
    const Scratch &s = cs->s;
    cudaStream_t st = cs->stream;
    const int64_t QKV = (NH + 2 * NKV) * hd;
    gpu_embed(cm->emb, cm->emb_bf16, s.tok, M, C, s.x, st);
    for (int64_t li = 0; li < c.n_layer; li++) {
        const GpuLayer &L = cm->layers[(size_t)li];
        const GpuKV &kv = cs->kv[(size_t)li];
        const GpuQAct xq{s.xq, s.xd};
        /* x += wo(attn(norm(x))): the norm quantizes its output once for q, k and v */
        gpu_rms_norm(s.x, L.attn_norm, M, C, c.norm_eps, s.hn, qact_for(L.wqkv, s), st);
        gpu_matmul(L.wqkv, s.hn, xq, M, s.qkv, st);
        gpu_rope_cache(s.qkv, QKV, cm->cos_t, cm->sin_t, s.seq, s.pos, M, NH, NKV, hd, kv, st);
        if (quantized(L.wo) && hd % 32 == 0) { /* attention quantizes its output for wo */
            gpu_attention(s.qkv, QKV, s.seq, s.pos, M, NH, NKV, hd, max_pos, kv, s.att_part,
                          s.att, xq, st);
            gpu_matmul(L.wo, s.att, xq, M, s.x, st, s.x);
        } else {
            gpu_attention(s.qkv, QKV, s.seq, s.pos, M, NH, NKV, hd, max_pos, kv, s.att_part,
                          s.att, GpuQAct{nullptr, nullptr}, st);
            linear(L.wo, s.att, s, M, s.x, st, s.x);
        }
        /* x += w2(silu(w1 n) * w3 n), n = norm(x) */
        if (c.has_moe) {
            gpu_rms_norm(s.x, L.ffn_norm, M, C, c.norm_eps, s.hn, GpuQAct{nullptr, nullptr}, st);
            if (!moe_ffn_gpu(m, cs, li, M, err)) return false;
            gpu_add(s.x, s.f, M * C, s.x, st);
        } else {
            gpu_rms_norm(s.x, L.ffn_norm, M, C, c.norm_eps, s.hn, qact_for(L.w13, s), st);
            gpu_matmul(L.w13, s.hn, xq, M, s.gu, st);
            gpu_silu_mul(s.gu, s.gu + F, M, F, 2 * F, s.g, qact_for(L.w2, s), st);
            gpu_matmul(L.w2, s.g, xq, M, s.x, st, s.x);
        }
    }
    gpu_gather_rows(s.x, s.out_rows, R, C, s.xs, st);
    gpu_rms_norm(s.xs, cm->norm, R, C, c.norm_eps, s.hs, qact_for(cm->output, s), st);
    gpu_matmul(cm->output, s.hs, GpuQAct{s.xq, s.xd}, R, s.logits, st);
    return true;
}

}  // namespace

bool cuda_session_init(ats_session *sess, CudaSession **out, std::string *err) {
    const char *env = getenv("ATS_CUDA_GRAPHS");
    const std::string graphs = env ? env : "1";
    if (graphs != "0" && graphs != "1") {
        *err = "ATS_CUDA_GRAPHS must be 0 or 1, got '" + graphs + "'";
        return false;
    }
    const char *env_pdl = getenv("ATS_CUDA_PDL"), *env_mma = getenv("ATS_CUDA_MMA");
    const std::string pdl = env_pdl ? env_pdl : "1", mma = env_mma ? env_mma : "1";
    if (pdl != "0" && pdl != "1") {
        *err = "ATS_CUDA_PDL must be 0 or 1, got '" + pdl + "'";
        return false;
    }
    if (mma != "0" && mma != "1") {
        *err = "ATS_CUDA_MMA must be 0 or 1, got '" + mma + "'";
        return false;
    }
    const Config &c = sess->model->cfg;
    const int64_t hd = c.head_dim, KV = c.n_kv_head * hd;
    if (sess->max_len > gpu_attention_max_keys(hd)) {
        *err = "device 'cuda': a session of max_len " + std::to_string(sess->max_len) +
               " exceeds the GPU attention kernel's " + std::to_string(gpu_attention_max_keys(hd)) +
               " key slots";
        return false;
    }
    std::unique_ptr<CudaSession> cs(new CudaSession());
    cs->graphs = graphs == "1";
    cs->pdl = pdl == "1";
    cs->mma = mma == "1";
    CUDA_TRY(cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking), "stream");
    const size_t slots = (size_t)sess->n_seq * (size_t)sess->max_len;
    cs->kv.resize((size_t)c.n_layer);
    for (GpuKV &kv : cs->kv) {
        kv.max_len = sess->max_len;
        if (!alloc(&cs->cache_allocs, slots * KV * sizeof(float), &kv.k, err) ||
            !alloc(&cs->cache_allocs, slots * KV * sizeof(float), &kv.v, err) ||
            !alloc(&cs->cache_allocs, slots, &kv.valid, err)) {
            *err += " (KV cache of " + std::to_string(sess->n_seq) + " x " +
                    std::to_string(sess->max_len) + " tokens)";
            return false;
        }
        CUDA_TRY(cudaMemsetAsync(kv.valid, 0, slots, cs->stream), "KV cache init");
    }
    CUDA_TRY(cudaStreamSynchronize(cs->stream), "KV cache init");
    *out = cs.release();
    return true;
}

void cuda_session_free(CudaSession *cs) { delete cs; }

void cuda_session_reset(ats_session *sess, int32_t b) {
    CudaSession *cs = sess->cuda;
    for (GpuKV &kv : cs->kv) gpu_clear_valid(kv.valid, b, kv.max_len, cs->stream);
}

bool cuda_session_forward(ats_session *sess, const int32_t *const *ids, const int32_t *n_new,
                          float *last_logits, float *all_logits, int32_t *last_tokens,
                          std::string *err) {
    const ats_model *m = sess->model;
    CudaSession *cs = sess->cuda;
    const int64_t V = m->cfg.vocab_size;
    std::vector<int32_t> seq, pos, tok, out_rows;
    int64_t max_pos = 0;
    for (int32_t b = 0; b < sess->n_seq; b++) {
        for (int32_t t = 0; t < n_new[b]; t++) {
            seq.push_back(b);
            pos.push_back(sess->length[(size_t)b] + t);
            tok.push_back(ids[b][t]);
            max_pos = std::max<int64_t>(max_pos, pos.back());
        }
    }
    const int64_t M = (int64_t)tok.size();
    if (M == 0) return true;
    for (int64_t r = 0; r < M; r++) {
        if (all_logits || r + 1 == M || seq[(size_t)(r + 1)] != seq[(size_t)r]) {
            out_rows.push_back((int32_t)r);
        }
    }
    const int64_t R = (int64_t)out_rows.size();
    if (!scratch_reserve(cs, m->cfg, M, R, err)) return false;
    gpu_set_mma(cs->mma); /* this thread's matmuls, graph capture included */
    const Scratch &s = cs->s;
    cudaStream_t st = cs->stream;
    std::vector<int32_t> &up = cs->upload; /* s.tok's layout: tok, seq, pos, out_rows */
    up.assign((size_t)(4 * s.M), 0);
    std::copy(tok.begin(), tok.end(), up.begin());
    std::copy(seq.begin(), seq.end(), up.begin() + s.M);
    std::copy(pos.begin(), pos.end(), up.begin() + 2 * s.M);
    std::copy(out_rows.begin(), out_rows.end(), up.begin() + 3 * s.M);
    CUDA_TRY(cudaMemcpyAsync(s.tok, up.data(), up.size() * 4, cudaMemcpyHostToDevice, st),
             "upload");
    const bool decode = R == M && !all_logits;
    if (decode && cs->graphs && !m->cfg.has_moe) {
        auto it = cs->decode.find(M);
        if (it == cs->decode.end()) {
            cudaGraph_t graph;
            CUDA_TRY(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "graph capture");
            gpu_set_pdl(cs->pdl);
            const bool ok = run_kernels(m, cs, M, R, sess->max_len - 1, err);
            gpu_set_pdl(false);
            CUDA_TRY(cudaStreamEndCapture(st, &graph), "graph capture");
            if (!ok) {
                cudaGraphDestroy(graph);
                return false;
            }
            cudaGraphExec_t exec;
            cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
            cudaGraphDestroy(graph);
            CUDA_TRY(e, "graph instantiation");
            it = cs->decode.emplace(M, exec).first;
        }
        CUDA_TRY(cudaGraphLaunch(it->second, st), "graph launch");
    } else if (!run_kernels(m, cs, M, R, max_pos, err)) {
        return false;
    }
    CUDA_TRY(cudaGetLastError(), "kernel launch");
    /* logits straight into the caller's arrays: all of them, or each sequence's last row
     * (runs of consecutive sequences in one copy) */
    if (all_logits) {
        CUDA_TRY(cudaMemcpyAsync(all_logits, s.logits, (size_t)(R * V) * sizeof(float),
                                 cudaMemcpyDeviceToHost, st),
                 "logits download");
    } else if (last_logits) {
        for (int64_t i = 0; i < R;) {
            const int32_t b0 = seq[(size_t)out_rows[(size_t)i]];
            int64_t j = i + 1;
            while (j < R && seq[(size_t)out_rows[(size_t)j]] == b0 + (j - i)) j++;
            CUDA_TRY(cudaMemcpyAsync(last_logits + (int64_t)b0 * V, s.logits + i * V,
                                     (size_t)((j - i) * V) * sizeof(float),
                                     cudaMemcpyDeviceToHost, st),
                     "logits download");
            i = j;
        }
    }
    std::vector<int32_t> tokens;
    if (last_tokens) { /* the greedy choices: R ids back instead of R rows of logits */
        tokens.resize((size_t)R);
        gpu_argmax_rows(s.logits, R, V, s.amax_keys, s.amax, st);
        CUDA_TRY(cudaMemcpyAsync(tokens.data(), s.amax, (size_t)R * 4, cudaMemcpyDeviceToHost, st),
                 "token download");
    }
    CUDA_TRY(cudaStreamSynchronize(st), "forward pass");
    for (int32_t b = 0; b < sess->n_seq; b++) sess->length[(size_t)b] += n_new[b];
    for (int64_t i = 0; last_tokens && i < R; i++) {
        const int64_t r = out_rows[(size_t)i];
        if (r + 1 == M || seq[(size_t)(r + 1)] != seq[(size_t)r]) {
            last_tokens[seq[(size_t)r]] = tokens[(size_t)i];
        }
    }
    if (all_logits && last_logits) {
        for (int64_t i = 0; i < R; i++) {
            const int64_t r = out_rows[(size_t)i];
            if (r + 1 == M || seq[(size_t)(r + 1)] != seq[(size_t)r]) {
                memcpy(last_logits + (int64_t)seq[(size_t)r] * V, all_logits + i * V,
                       (size_t)V * sizeof(float));
            }
        }
    }
    return true;
}

}  // namespace ats
