/* CUDA kernels of the GPU forward pass (launchers; every launch goes on the given stream). Rows
 * are tokens as in forward.h: (M, C) matrices, fp32 activations. Weights as uploaded by
 * model_cuda.cu (GpuWeight). The quantized matmuls follow the CPU's integer scheme exactly:
 * activations rounded to int8 per 32-block (Q8_0: d = max|x| / 127, q = round(x / d)), an exact
 * integer dot per block (dp4a), scaled per block; int4 scales rounded to fp16 as in the CPU's
 * packed copy. */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace ats {

/* Programmatic dependent launch (PDL, sm_90): every kernel starts with pdl_sync(), which waits
 * until the kernels before it in the stream have finished and their writes are visible
 * (griddepcontrol.wait), then lets the next kernel be scheduled (launch_dependents), so a
 * kernel launched with the PDL attribute has its blocks placed while its predecessor's last
 * blocks run, and starts the moment it ends. Without the attribute both are no-ops. */
__device__ __forceinline__ void pdl_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Whether this thread's launches carry the PDL attribute (session_cuda.cu sets it while it
 * captures a decode graph); off by default. */
void gpu_set_pdl(bool on);
bool gpu_pdl();

/* kernel<<<grid, block, smem, st>>>(args...), with the PDL attribute when gpu_pdl(). */
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
            A... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = gpu_pdl() ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, ((P)args)...);
}

enum GpuWeightType { GPU_F32 = 0, GPU_BF16 = 1, GPU_Q8 = 2, GPU_Q4 = 3 };

/* One matmul weight W (rows = out features, cols = in features) in GPU memory. */
struct GpuWeight {
    GpuWeightType type = GPU_F32;
    int64_t rows = 0, cols = 0;
    const void *data = nullptr;    /* F32/BF16: (rows, cols); Q8: int8 (rows, cols);
                                      Q4: (rows, cols / 32) blocks of 16 bytes, byte j holding
                                      element j (low nibble) and j + 16 (high), weight code - 8 */
    const float *scale = nullptr;  /* Q8: (rows) */
    const __half *scale4 = nullptr; /* Q4: (rows, cols / group) */
    int group = 0;                  /* Q4 group size */
};

/* Activation rows quantized for the integer matmuls: q (N, C) int8, d (N, C / 32). */
struct GpuQAct {
    int8_t *q;
    float *d;
};

/* y (N, w.rows) = x (N, w.cols) @ W^T (+ res (N, w.rows) when res is not NULL; y may alias
 * res): fp32 x for float weights, xq for quantized ones. */
void gpu_matmul(const GpuWeight &w, const float *x, const GpuQAct &xq, int64_t N, float *y,
                cudaStream_t st, const float *res = nullptr);
/* Whether this thread's int8 / int4 matmuls of N > 1 rows take the tensor-core kernel (the
 * default) or the warp kernel (cuda_matmul_bench compares them); their outputs are identical. */
void gpu_set_mma(bool on);
/* xq = Q8_0(x) for x (N, C), C % 32 == 0. */
void gpu_quantize(const float *x, int64_t N, int64_t C, GpuQAct xq, cudaStream_t st);

/* Q8_0 of one 32-block, v = element lane of block b, called by all 32 lanes of a warp: the
 * CPU's quantize_q8_0_scalar (d = amax / 127, q = rint(x * 127 / amax), round half to even,
 * clamped to [-127, 127]). */
__device__ __forceinline__ void quantize_block(float v, int64_t b, int8_t *q, float *d) {
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int c = __float2int_rn(__fmul_rn(v, inv));
    q[b * 32 + (threadIdx.x & 31)] = (int8_t)(c < -127 ? -127 : c > 127 ? 127 : c);
    if ((threadIdx.x & 31) == 0) d[b] = amax / 127.0f;
}

/* x (M, C) = embedding rows of tok (fp32 or bf16 table). */
void gpu_embed(const void *table, bool bf16, const int32_t *tok, int64_t M, int64_t C, float *x,
               cudaStream_t st);
/* y = rmsnorm(x) * w per row (sum of squares in double, as the CPU's norm_row), and xq =
 * Q8_0(y) when xq.q is not NULL (C % 32 == 0); y does not alias x. */
void gpu_rms_norm(const float *x, const float *w, int64_t M, int64_t C, double eps, float *y,
                  GpuQAct xq, cudaStream_t st);
/* y = a + b (n elements); y may alias a. */
void gpu_add(const float *a, const float *b, int64_t n, float *y, cudaStream_t st);
/* y (M, F) = silu(g) * u for g, u rows of stride ld (y may alias g when ld == F), and xq =
 * Q8_0(y) when xq.q is not NULL (F % 32 == 0). */
void gpu_silu_mul(const float *g, const float *u, int64_t M, int64_t F, int64_t ld, float *y,
                  GpuQAct xq, cudaStream_t st);
/* dst row i = src row rows[i] (R rows of C). */
void gpu_gather_rows(const float *src, const int32_t *rows, int64_t R, int64_t C, float *dst,
                     cudaStream_t st);

/* out[i] = logits_argmax of row i of x (R rows of V): the first index of the largest value,
 * NaN never larger (index 0 when x[0] is NaN); keys: gpu_argmax_parts(V) * R scratch. */
int64_t gpu_argmax_parts(int64_t V);
void gpu_argmax_rows(const float *x, int64_t R, int64_t V, unsigned long long *keys,
                     int32_t *out, cudaStream_t st);

/* MoE combine: y[n] = sum_j w[n, j] * ys[slot[n, j]] (slots in choice order, -1 = dropped)
 * + shared[n] when shared is not NULL; y (M, C). */
void gpu_moe_combine(const float *ys, const int32_t *slot, const float *w, const float *shared,
                     int64_t M, int64_t K, int64_t C, float *y, cudaStream_t st);

/* The layer's KV cache of one session: (n_seq, max_len, n_kv * hd) keys and values, validity
 * (n_seq, max_len). */
struct GpuKV {
    float *k, *v;
    uint8_t *valid;
    int64_t max_len;
};

/* qkv (M, ld): each row's q (NH*hd), k (NKV*hd) and v (NKV*hd) side by side. RoPE on q in
 * place and on k at each row's position, the rotated k and v written into the cache slot
 * (seq[r], pos[r]), marked valid. */
void gpu_rope_cache(float *qkv, int64_t ld, const float *cos_t, const float *sin_t,
                    const int32_t *seq, const int32_t *pos, int64_t M, int64_t NH, int64_t NKV,
                    int64_t hd, GpuKV kv, cudaStream_t st);
/* Causal GQA attention of every row (query q + r * ld) over the valid slots <= its position
 * of its sequence: out (M, NH*hd), and xq = Q8_0(out) when xq.q is not NULL (hd % 32 == 0).
 * max_pos bounds every row's position (sizes the splits of the key slots and their scores in
 * shared memory); part: gpu_attention_part_floats(M, NH, hd) scratch for the splits. */
void gpu_attention(const float *q, int64_t ld, const int32_t *seq, const int32_t *pos,
                   int64_t M, int64_t NH, int64_t NKV, int64_t hd, int64_t max_pos, GpuKV kv,
                   float *part, float *out, GpuQAct xq, cudaStream_t st);
int64_t gpu_attention_part_floats(int64_t M, int64_t NH, int64_t hd);
/* The most key slots gpu_attention takes (a row's scores may live in one block's shared
 * memory) and the largest head_dim it takes. */
int64_t gpu_attention_max_keys(int64_t hd);
int64_t gpu_attention_max_head_dim();
/* Marks slots [0, max_len) of sequence b invalid in every layer's validity array. */
void gpu_clear_valid(uint8_t *valid, int64_t b, int64_t max_len, cudaStream_t st);

}  // namespace ats
