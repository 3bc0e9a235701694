/* The GPU copy of a loaded model (weights uploaded once at ats_model_init) and the GPU side of
 * its sessions (KV cache, scratch, a stream): backend.h's entry points. The forward pass is
 * forward.cpp's, kernel for kernel:
 *
 *   embed -> [ h = x + wo(attn(norm(x)));  x = h + w2(silu(w1 n) * w3 n), n = norm(h) ] x L
 *         -> norm -> output head
 *
 * Float weights stay fp32, or bf16 when every value is exactly a bfloat16 (a bf16 checkpoint:
 * lossless, half the bytes). int8 / int4 weights keep the loader's codes (int4 reordered per
 * 32-block for dp4a, scales rounded to fp16 as the CPU's packed copy). wq, wk and wv are
 * uploaded as one matrix (rows q | k | v), as are w1 and w3 (gate | up). */
#include <string.h>

#include <algorithm>
#include <vector>

#include "../runtime/forward.h"
#include "backend.h"
#include "kernels.cuh"
#include "model_cuda.h"

namespace ats {

bool cuda_built() { return true; }

namespace {

struct Uploader {
    CudaModel *cm;
    std::string *err;

    bool copy(const void *host, size_t bytes, const void **out) {
        void *d = nullptr;
        CUDA_TRY(cudaMalloc(&d, bytes), "out of GPU memory uploading the weights");
        cm->allocs.push_back(d);
        CUDA_TRY(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "weight upload");
        *out = d;
        return true;
    }

    /* fp32 values as bf16 when all are exactly bfloat16 (low 16 bits zero), else as fp32. */
    bool floats(const float *x, size_t n, const void **out, bool *bf16) {
        *bf16 = true;
        for (size_t i = 0; i < n && *bf16; i++) {
            uint32_t b;
            memcpy(&b, &x[i], 4);
            *bf16 = (b & 0xFFFF) == 0;
        }
        if (!*bf16) return copy(x, n * sizeof(float), out);
        std::vector<uint16_t> h(n);
        for (size_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &x[i], 4);
            h[i] = (uint16_t)(b >> 16);
        }
        return copy(h.data(), n * 2, out);
    }

    bool vec(const float *x, int64_t n, const float **out) {
        return copy(x, (size_t)n * sizeof(float), (const void **)out);
    }

    bool weight(const Weight &w, const std::string &name, GpuWeight *g) {
        g->rows = w.rows;
        g->cols = w.cols;
        const size_t n = (size_t)(w.rows * w.cols);
        if (w.type == WEIGHT_F32) {
            if (w.cols % 8 != 0) {
                *err = "device 'cuda': " + name + " has " + std::to_string(w.cols) +
                       " in features; the GPU matmuls need a multiple of 8";
                return false;
            }
            bool bf16;
            if (!floats(w.f32, n, &g->data, &bf16)) return false;
            g->type = bf16 ? GPU_BF16 : GPU_F32;
            return true;
        }
        if (w.cols % 32 != 0) {
            *err = "device 'cuda': " + name + " has " + std::to_string(w.cols) +
                   " in features; the GPU's integer matmuls need a multiple of 32";
            return false;
        }
        if (w.type == WEIGHT_Q8) {
            g->type = GPU_Q8;
            return copy(w.q8, n, &g->data) &&
                   vec(w.scale, w.rows, &g->scale);
        }
        /* int4: per 32-block, byte j = element j (low nibble) | element j + 16 (high) */
        g->type = GPU_Q4;
        g->group = w.group;
        const int64_t nb = w.cols / 32, ng = w.cols / w.group;
        std::vector<uint8_t> codes(n / 2);
        for (int64_t r = 0; r < w.rows; r++) {
            const uint8_t *src = w.q4 + r * (w.cols / 2);
            for (int64_t b = 0; b < nb; b++) {
                for (int j = 0; j < 16; j++) {
                    const int64_t e0 = b * 32 + j, e1 = e0 + 16;
                    const uint8_t c0 = (src[e0 / 2] >> (4 * (e0 % 2))) & 0x0F;
                    const uint8_t c1 = (src[e1 / 2] >> (4 * (e1 % 2))) & 0x0F;
                    codes[(size_t)((r * nb + b) * 16 + j)] = (uint8_t)(c0 | (c1 << 4));
                }
            }
        }
        std::vector<uint16_t> scale((size_t)(w.rows * ng));
        for (size_t i = 0; i < scale.size(); i++) scale[i] = fp16_from_f32(w.scale[i]);
        return copy(codes.data(), codes.size(), &g->data) &&
               copy(scale.data(), scale.size() * 2, (const void **)&g->scale4);
    }

    /* Weights of one input side by side as one (sum of rows, cols) weight, so one launch reads
     * them all (q, k, v; gate and up): the parts must share type, cols and int4 group. */
    bool fused(const std::vector<const Weight *> &parts, const std::string &name, GpuWeight *g) {
        const Weight &w0 = *parts[0];
        Weight cat = w0;
        cat.rows = 0;
        cat.packed = nullptr;
        for (const Weight *w : parts) {
            if (w->type != w0.type || w->cols != w0.cols || w->group != w0.group) {
                *err = "device 'cuda': " + name + " are fused into one matmul and need one " +
                       "type, in-feature count and int4 group (got " +
                       std::to_string((int)w0.type) + "/" + std::to_string(w0.cols) + "/" +
                       std::to_string(w0.group) + " and " + std::to_string((int)w->type) + "/" +
                       std::to_string(w->cols) + "/" + std::to_string(w->group) + ")";
                return false;
            }
            cat.rows += w->rows;
        }
        const int64_t cols = w0.cols;
        const int64_t n_scale = w0.type == WEIGHT_Q8   ? 1
                                : w0.type == WEIGHT_Q4 ? cols / w0.group
                                                       : 0; /* scales per row */
        std::vector<float> f32, scale;
        std::vector<int8_t> q8;
        std::vector<uint8_t> q4;
        for (const Weight *w : parts) {
            const size_t n = (size_t)(w->rows * cols);
            if (w0.type == WEIGHT_F32) f32.insert(f32.end(), w->f32, w->f32 + n);
            if (w0.type == WEIGHT_Q8) q8.insert(q8.end(), w->q8, w->q8 + n);
            if (w0.type == WEIGHT_Q4) q4.insert(q4.end(), w->q4, w->q4 + n / 2);
            scale.insert(scale.end(), w->scale, w->scale + w->rows * n_scale);
        }
        cat.f32 = f32.data();
        cat.q8 = q8.data();
        cat.q4 = q4.data();
        cat.scale = scale.data();
        return weight(cat, name, g);
    }
};

}  // namespace

bool cuda_model_init(const ats_model *m, CudaModel **out, std::string *err) {
    const Config &c = m->cfg;
    if (c.has_mod) {
        *err = "device 'cuda' runs dense and MoE models; this model's family is '" + c.family + "'";
        return false;
    }
    int n_dev = 0;
    CUDA_TRY(cudaGetDeviceCount(&n_dev), "no usable CUDA device");
    if (n_dev < 1) {
        *err = "device 'cuda': no CUDA device";
        return false;
    }
    if (c.head_dim % 2 != 0 || c.head_dim > gpu_attention_max_head_dim() || c.dim % 32 != 0) {
        *err = "device 'cuda' needs dim % 32 == 0 and an even head_dim <= " +
               std::to_string(gpu_attention_max_head_dim()) + " (got dim " +
               std::to_string(c.dim) + ", head_dim " + std::to_string(c.head_dim) + ")";
        return false;
    }
    std::unique_ptr<CudaModel> cm(new CudaModel());
    Uploader up{cm.get(), err};
    if (!up.floats(m->tok_embeddings, (size_t)(c.vocab_size * c.dim), &cm->emb, &cm->emb_bf16) ||
        !up.vec(m->norm, c.dim, &cm->norm) || !up.weight(m->output, "output.weight", &cm->output) ||
        !up.vec(m->rope_cos.data(), (int64_t)m->rope_cos.size(), &cm->cos_t) ||
        !up.vec(m->rope_sin.data(), (int64_t)m->rope_sin.size(), &cm->sin_t)) {
        return false;
    }
    cm->layers.resize((size_t)c.n_layer);
    for (int64_t i = 0; i < c.n_layer; i++) {
        const Layer &L = m->layers[(size_t)i];
        GpuLayer &G = cm->layers[(size_t)i];
        const std::string p = "layers." + std::to_string(i) + ".";
        if (!up.vec(L.attn_norm, c.dim, &G.attn_norm) || !up.vec(L.ffn_norm, c.dim, &G.ffn_norm) ||
            !up.fused({&L.wq, &L.wk, &L.wv}, p + "attn.wq/wk/wv", &G.wqkv) ||
            !up.weight(L.wo, p + "attn.wo", &G.wo)) {
            return false;
        }
        if (!c.has_moe) {
            if (!up.fused({&L.w1, &L.w3}, p + "ffn.w1/w3", &G.w13) ||
                !up.weight(L.w2, p + "ffn.w2", &G.w2)) {
                return false;
            }
            continue;
        }
        Weight router;
        router.rows = c.n_experts;
        router.cols = c.dim;
        router.f32 = L.router;
        if (!up.weight(router, p + "ffn.router", &G.router)) return false;
        G.ew1.resize((size_t)c.n_experts);
        G.ew2.resize((size_t)c.n_experts);
        G.ew3.resize((size_t)c.n_experts);
        for (int64_t e = 0; e < c.n_experts; e++) {
            const std::string pe = p + "ffn.experts[" + std::to_string(e) + "].";
            if (!up.weight(weight_slice(L.ew1, e), pe + "w1", &G.ew1[(size_t)e]) ||
                !up.weight(weight_slice(L.ew2, e), pe + "w2", &G.ew2[(size_t)e]) ||
                !up.weight(weight_slice(L.ew3, e), pe + "w3", &G.ew3[(size_t)e])) {
                return false;
            }
        }
        G.has_shared = L.has_shared;
        if (L.has_shared && (!up.weight(L.sw1, p + "ffn.shared.w1", &G.sw1) ||
                             !up.weight(L.sw2, p + "ffn.shared.w2", &G.sw2) ||
                             !up.weight(L.sw3, p + "ffn.shared.w3", &G.sw3))) {
            return false;
        }
    }
    *out = cm.release();
    return true;
}

void cuda_model_free(CudaModel *cm) { delete cm; }

}  // namespace ats
