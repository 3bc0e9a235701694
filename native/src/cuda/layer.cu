/* Row-wise kernels of a block on the GPU: embedding lookup, RMSNorm, residual adds, SwiGLU's
 * gate, RoPE with the KV cache write, and causal GQA attention over the cache (one thread block
 * per (row, query head), scores in shared memory). Each mirrors its CPU counterpart in
 * src/runtime (ffn.cpp norm_row, attention.cpp rope_row / softmax_values). */
#include <math.h>

#include "kernels.cuh"

namespace ats {

static const int THREADS = 256;

__global__ void embed(const void *table, bool bf16, const int32_t *tok, int64_t C, float *x) {
    const int64_t r = blockIdx.x, t = tok[r];
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        x[r * C + i] = bf16 ? __bfloat162float(((const __nv_bfloat16 *)table)[t * C + i])
                            : ((const float *)table)[t * C + i];
    }
}

void gpu_embed(const void *table, bool bf16, const int32_t *tok, int64_t M, int64_t C, float *x,
               cudaStream_t st) {
    embed<<<(unsigned)M, THREADS, 0, st>>>(table, bf16, tok, C, x);
}

/* Block sum of one double per thread (THREADS threads). */
__device__ double block_sum(double v, double *shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < (int)blockDim.x / 32; i++) s += shared[i];
        shared[0] = s;
    }
    __syncthreads();
    const double s = shared[0];
    __syncthreads();
    return s;
}

__global__ void rms_norm(const float *x, const float *w, int64_t C, double eps, float *y) {
    __shared__ double part[THREADS / 32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * C;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss, part);
    const float inv = (float)(1.0 / sqrt(ss / (double)C + eps));
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        y[r * C + i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
    }
}

void gpu_rms_norm(const float *x, const float *w, int64_t M, int64_t C, double eps, float *y,
                  cudaStream_t st) {
    rms_norm<<<(unsigned)M, THREADS, 0, st>>>(x, w, C, eps, y);
}

__global__ void add(const float *a, const float *b, int64_t n, float *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

void gpu_add(const float *a, const float *b, int64_t n, float *y, cudaStream_t st) {
    add<<<(unsigned)((n + THREADS - 1) / THREADS), THREADS, 0, st>>>(a, b, n, y);
}

__global__ void silu_mul(float *g, const float *u, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = __fmul_rn(__fdiv_rn(g[i], 1.0f + expf(-g[i])), u[i]);
}

void gpu_silu_mul(float *g, const float *u, int64_t n, cudaStream_t st) {
    silu_mul<<<(unsigned)((n + THREADS - 1) / THREADS), THREADS, 0, st>>>(g, u, n);
}

__global__ void gather_rows(const float *src, const int32_t *rows, int64_t C, float *dst) {
    const int64_t i = blockIdx.x, r = rows[i];
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) dst[i * C + j] = src[r * C + j];
}

void gpu_gather_rows(const float *src, const int32_t *rows, int64_t R, int64_t C, float *dst,
                     cudaStream_t st) {
    gather_rows<<<(unsigned)R, THREADS, 0, st>>>(src, rows, C, dst);
}

__global__ void moe_combine(const float *ys, const int32_t *slot, const float *w,
                            const float *shared, int64_t K, int64_t C, float *y) {
    const int64_t n = blockIdx.x;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            const int32_t s = slot[n * K + j];
            if (s >= 0) acc = __fadd_rn(acc, __fmul_rn(ys[(int64_t)s * C + i], w[n * K + j]));
        }
        y[n * C + i] = shared ? __fadd_rn(acc, shared[n * C + i]) : acc;
    }
}

void gpu_moe_combine(const float *ys, const int32_t *slot, const float *w, const float *shared,
                     int64_t M, int64_t K, int64_t C, float *y, cudaStream_t st) {
    moe_combine<<<(unsigned)M, THREADS, 0, st>>>(ys, slot, w, shared, K, C, y);
}

/* One row: rotate its NH query and NKV key heads (x*cos + rotate_half(x)*sin), then write k and
 * v into the cache slot and mark it valid. */
__global__ void rope_cache(float *q, float *k, const float *v, const float *cos_t,
                           const float *sin_t, const int32_t *seq, const int32_t *pos,
                           int64_t NH, int64_t NKV, int64_t hd, GpuKV kv) {
    const int64_t r = blockIdx.x, half = hd / 2, KV = NKV * hd;
    const float *cs = cos_t + (int64_t)pos[r] * hd, *sn = sin_t + (int64_t)pos[r] * hd;
    for (int64_t t = threadIdx.x; t < (NH + NKV) * half; t += blockDim.x) {
        const int64_t h = t / half, i = t % half;
        float *x = h < NH ? q + r * NH * hd + h * hd : k + r * KV + (h - NH) * hd;
        const float a = x[i], b = x[i + half];
        x[i] = __fadd_rn(__fmul_rn(a, cs[i]), __fmul_rn(-b, sn[i]));
        x[i + half] = __fadd_rn(__fmul_rn(b, cs[i + half]), __fmul_rn(a, sn[i + half]));
    }
    __syncthreads();
    const int64_t slot = (int64_t)seq[r] * kv.max_len + pos[r];
    for (int64_t i = threadIdx.x; i < KV; i += blockDim.x) {
        kv.k[slot * KV + i] = k[r * KV + i];
        kv.v[slot * KV + i] = v[r * KV + i];
    }
    if (threadIdx.x == 0) kv.valid[slot] = 1;
}

void gpu_rope_cache(float *q, float *k, const float *v, const float *cos_t, const float *sin_t,
                    const int32_t *seq, const int32_t *pos, int64_t M, int64_t NH, int64_t NKV,
                    int64_t hd, GpuKV kv, cudaStream_t st) {
    rope_cache<<<(unsigned)M, THREADS, 0, st>>>(q, k, v, cos_t, sin_t, seq, pos, NH, NKV, hd, kv);
}

static const int ATT_THREADS = 128;

/* Block (row r, query head h): scores of the valid slots <= pos (a warp per key, lanes over the
 * head dimensions), softmax (max, exp, double sum), then each thread sums p_j * v_j for its head
 * dimensions in slot order, as the CPU's axpy does. Shared memory: hd query values, then one
 * score per slot. */
__global__ void attention(const float *q, const int32_t *seq, const int32_t *pos, int64_t NH,
                          int64_t NKV, int64_t hd, GpuKV kv, float *out) {
    extern __shared__ float smem[];
    __shared__ double part[ATT_THREADS / 32];
    __shared__ float fpart[ATT_THREADS / 32];
    float *qs = smem, *sc = smem + hd;
    const int64_t r = blockIdx.x, h = blockIdx.y, kvh = h / (NH / NKV), KV = NKV * hd;
    const int64_t base = (int64_t)seq[r] * kv.max_len, n = (int64_t)pos[r] + 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[r * NH * hd + h * hd + d];
    __syncthreads();
    for (int64_t j = warp; j < n; j += nw) {
        const float *kr = kv.k + (base + j) * KV + kvh * hd;
        float s = 0.0f;
        for (int64_t d = lane; d < hd; d += 32) s += qs[d] * kr[d];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) sc[j] = kv.valid[base + j] ? s * scale : -INFINITY;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) fpart[warp] = mx;
    __syncthreads();
    mx = fpart[0];
    for (int i = 1; i < nw; i++) mx = fmaxf(mx, fpart[i]);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = kv.valid[base + j] ? expf(sc[j] - mx) : 0.0f;
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, part); /* its barriers also publish sc */
    const float inv = (float)(1.0 / sum);
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float p = sc[j];
            if (p != 0.0f) acc = fmaf(p * inv, kv.v[(base + j) * KV + kvh * hd + d], acc);
        }
        out[r * NH * hd + h * hd + d] = acc;
    }
}

static int max_smem_bytes() {
    static int bytes = -1;
    if (bytes < 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        /* the static shared arrays of the kernel come out of the same budget */
        bytes -= 1024;
        cudaFuncSetAttribute(attention, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    }
    return bytes;
}

int64_t gpu_attention_max_keys(int64_t hd) { return max_smem_bytes() / 4 - hd; }

void gpu_attention(const float *q, const int32_t *seq, const int32_t *pos, int64_t M, int64_t NH,
                   int64_t NKV, int64_t hd, int64_t max_pos, GpuKV kv, float *out,
                   cudaStream_t st) {
    max_smem_bytes();
    const size_t smem = (size_t)(hd + max_pos + 1) * sizeof(float);
    attention<<<dim3((unsigned)M, (unsigned)NH), ATT_THREADS, smem, st>>>(q, seq, pos, NH, NKV,
                                                                         hd, kv, out);
}

__global__ void clear_valid(uint8_t *valid, int64_t b, int64_t max_len) {
    for (int64_t i = threadIdx.x; i < max_len; i += blockDim.x) valid[b * max_len + i] = 0;
}

void gpu_clear_valid(uint8_t *valid, int64_t b, int64_t max_len, cudaStream_t st) {
    clear_valid<<<1, THREADS, 0, st>>>(valid, b, max_len);
}

}  // namespace ats
