/* Row-wise kernels of a block on the GPU: embedding lookup, RMSNorm, residual adds, SwiGLU's
 * gate (quantizing their outputs for the next integer matmul), RoPE with the KV cache write,
 * and causal GQA attention over the cache (a thread block per (row, query head, split of the
 * key slots), scores in shared memory, then a pass combining the splits). Each mirrors its CPU
 * counterpart in src/runtime (ffn.cpp norm_row, attention.cpp rope_row / softmax_values). */
#include <math.h>

#include "kernels.cuh"

namespace ats {

static const int THREADS = 256;

static thread_local bool pdl_on = false;

void gpu_set_pdl(bool on) { pdl_on = on; }
bool gpu_pdl() { return pdl_on; }

__global__ void embed(const void *table, bool bf16, const int32_t *tok, int64_t C, float *x) {
    pdl_sync();
    const int64_t r = blockIdx.x, t = tok[r];
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        x[r * C + i] = bf16 ? __bfloat162float(((const __nv_bfloat16 *)table)[t * C + i])
                            : ((const float *)table)[t * C + i];
    }
}

void gpu_embed(const void *table, bool bf16, const int32_t *tok, int64_t M, int64_t C, float *x,
               cudaStream_t st) {
    launch(embed, dim3((unsigned)M), dim3(THREADS), 0, st, table, bf16, tok, C, x);
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

/* rms_norm: one block per row, NORM_PER elements of x and of w per thread loaded into registers
 * at once (element k * T + t of thread t, coalesced), the sum of squares in double reduced
 * across the block with one barrier, y written from the registers; with q set (C % 32 == 0,
 * T % 32 == 0) the 32 lanes of a warp hold one Q8_0 block of the output per k. Elements past
 * NORM_PER * 1024 (rows longer than the registers hold) are read again from x. */
static const int NORM_PER = 8;
static const int NORM_MAX_THREADS = 1024;

__global__ void __launch_bounds__(NORM_MAX_THREADS)
    rms_norm(const float *__restrict__ x, const float *__restrict__ w, int64_t C, double eps,
             float *__restrict__ y, int8_t *__restrict__ q, float *__restrict__ d) {
    pdl_sync();
    __shared__ double part[NORM_MAX_THREADS / 32];
    const int64_t T = blockDim.x, t = threadIdx.x, r = blockIdx.x, lane = t & 31;
    const float *xr = x + r * C;
    float v[NORM_PER], wv[NORM_PER];
#pragma unroll
    for (int k = 0; k < NORM_PER; k++) {
        const int64_t i = k * T + t;
        v[k] = i < C ? xr[i] : 0.0f;
        wv[k] = i < C ? w[i] : 0.0f;
    }
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_PER; k++) ss += (double)v[k] * v[k];
    for (int64_t i = NORM_PER * T + t; i < C; i += T) ss += (double)xr[i] * xr[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) part[t >> 5] = ss;
    __syncthreads();
    ss = part[0];
    for (int i = 1; i < (int)(T >> 5); i++) ss += part[i];
    const float inv = (float)(1.0 / sqrt(ss / (double)C + eps));
#pragma unroll
    for (int k = 0; k < NORM_PER; k++) {
        const int64_t i = k * T + t;
        const float o = __fmul_rn(__fmul_rn(v[k], inv), wv[k]);
        if (i < C) y[r * C + i] = o;
        if (q && i - lane < C) quantize_block(o, (r * C + i) / 32, q, d);
    }
    for (int64_t i = NORM_PER * T + t; i - lane < C; i += T) {
        const float o = i < C ? __fmul_rn(__fmul_rn(xr[i], inv), w[i]) : 0.0f;
        if (i < C) y[r * C + i] = o;
        if (q) quantize_block(o, (r * C + i) / 32, q, d);
    }
}

void gpu_rms_norm(const float *x, const float *w, int64_t M, int64_t C, double eps, float *y,
                  GpuQAct xq, cudaStream_t st) {
    /* threads: NORM_PER elements each, whole warps, 64 to NORM_MAX_THREADS */
    int64_t threads = (C + NORM_PER * 32 - 1) / (NORM_PER * 32) * 32;
    threads = threads < 64 ? 64 : threads > NORM_MAX_THREADS ? NORM_MAX_THREADS : threads;
    launch(rms_norm, dim3((unsigned)M), dim3((unsigned)threads), 0, st, x, w, C, eps, y, xq.q,
           xq.d);
}

__global__ void add(const float *a, const float *b, int64_t n, float *y) {
    pdl_sync();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

void gpu_add(const float *a, const float *b, int64_t n, float *y, cudaStream_t st) {
    launch(add, dim3((unsigned)((n + THREADS - 1) / THREADS)), dim3(THREADS), 0, st, a, b, n, y);
}

/* One thread per output element; with q set (F % 32 == 0) a warp's 32 elements are one Q8_0
 * block, so every lane stays to the shuffle. */
__global__ void silu_mul(const float *g, const float *u, int64_t M, int64_t F, int64_t ld,
                         float *y, int8_t *q, float *d) {
    pdl_sync();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool in = i < M * F;
    const int64_t r = in ? i / F : 0, c = in ? i % F : 0;
    const float gv = in ? g[r * ld + c] : 0.0f;
    const float v = in ? __fmul_rn(__fdiv_rn(gv, 1.0f + expf(-gv)), u[r * ld + c]) : 0.0f;
    if (in) y[i] = v;
    if (q && i - (threadIdx.x & 31) < M * F) quantize_block(v, i / 32, q, d);
}

void gpu_silu_mul(const float *g, const float *u, int64_t M, int64_t F, int64_t ld, float *y,
                  GpuQAct xq, cudaStream_t st) {
    launch(silu_mul, dim3((unsigned)((M * F + THREADS - 1) / THREADS)), dim3(THREADS), 0, st, g,
           u, M, F, ld, y, xq.q, xq.d);
}

/* argmax_rows: the logits_argmax rule (index 0 unless a later value is strictly larger, the
 * first of equal values, NaN never larger) in two passes. Pass 1: block (chunk c, row r) takes
 * ARGMAX_CHUNK elements (ARGMAX_PER loads per thread, all issued before any is compared) and
 * writes the largest key of its non-NaN elements, a key ordering by value, then by lower index
 * (0: no element). Pass 2: one warp per row takes the largest of the row's chunk keys; index 0
 * when x[0] is NaN (nothing compares larger than it). */
static const int ARGMAX_PER = 8;
static const int64_t ARGMAX_CHUNK = (int64_t)THREADS * ARGMAX_PER;

int64_t gpu_argmax_parts(int64_t V) { return (V + ARGMAX_CHUNK - 1) / ARGMAX_CHUNK; }

/* Value bits mapped to an unsigned order (negative floats reversed, -0 as +0) above the
 * complement of the index: a larger key is a larger value or, for equal values, a lower index. */
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i) {
    const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
    const unsigned ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)ord << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned)i);
}

__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long k) {
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long ok = __shfl_xor_sync(0xffffffffu, k, o);
        k = ok > k ? ok : k;
    }
    return k;
}

__global__ void argmax_chunks(const float *__restrict__ x, int64_t V, int64_t parts,
                              unsigned long long *__restrict__ keys) {
    pdl_sync();
    __shared__ unsigned long long wk[THREADS / 32];
    const int64_t r = blockIdx.y, i0 = (int64_t)blockIdx.x * ARGMAX_CHUNK + threadIdx.x;
    const float *xr = x + r * V;
    float v[ARGMAX_PER];
#pragma unroll
    for (int k = 0; k < ARGMAX_PER; k++) {
        const int64_t i = i0 + (int64_t)k * THREADS;
        v[k] = i < V ? xr[i] : NAN;
    }
    unsigned long long best = 0;
#pragma unroll
    for (int k = 0; k < ARGMAX_PER; k++) {
        const unsigned long long key = isnan(v[k]) ? 0ull : argmax_key(v[k], i0 + k * THREADS);
        best = key > best ? key : best;
    }
    best = warp_max_key(best);
    if ((threadIdx.x & 31) == 0) wk[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < THREADS / 32; w++) best = wk[w] > best ? wk[w] : best;
        keys[r * parts + blockIdx.x] = best;
    }
}

__global__ void argmax_finish(const float *__restrict__ x, int64_t V, int64_t parts,
                              const unsigned long long *__restrict__ keys, int32_t *out) {
    pdl_sync();
    const int64_t r = blockIdx.x;
    unsigned long long best = 0;
    for (int64_t c = threadIdx.x; c < parts; c += 32) {
        const unsigned long long k = keys[r * parts + c];
        best = k > best ? k : best;
    }
    best = warp_max_key(best);
    if (threadIdx.x == 0) {
        out[r] = isnan(x[r * V]) ? 0 : (int32_t)(0xFFFFFFFFu - (unsigned)(best & 0xFFFFFFFFu));
    }
}

void gpu_argmax_rows(const float *x, int64_t R, int64_t V, unsigned long long *keys,
                     int32_t *out, cudaStream_t st) {
    const int64_t parts = gpu_argmax_parts(V);
    launch(argmax_chunks, dim3((unsigned)parts, (unsigned)R), dim3(THREADS), 0, st, x, V, parts,
           keys);
    launch(argmax_finish, dim3((unsigned)R), dim3(32), 0, st, x, V, parts,
           (const unsigned long long *)keys, out);
}

__global__ void gather_rows(const float *src, const int32_t *rows, int64_t C, float *dst) {
    pdl_sync();
    const int64_t i = blockIdx.x, r = rows[i];
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) dst[i * C + j] = src[r * C + j];
}

void gpu_gather_rows(const float *src, const int32_t *rows, int64_t R, int64_t C, float *dst,
                     cudaStream_t st) {
    launch(gather_rows, dim3((unsigned)R), dim3(THREADS), 0, st, src, rows, C, dst);
}

__global__ void moe_combine(const float *ys, const int32_t *slot, const float *w,
                            const float *shared, int64_t K, int64_t C, float *y) {
    pdl_sync();
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
    launch(moe_combine, dim3((unsigned)M), dim3(THREADS), 0, st, ys, slot, w, shared, K, C, y);
}

/* Thread t of row blockIdx.x: for t < (NH + NKV) * hd / 2 the pair (i, i + hd/2) of one query
 * or key head rotated (x*cos + rotate_half(x)*sin; a key straight into the cache), else one
 * element of v copied into the cache. */
__global__ void rope_cache(float *qkv, int64_t ld, const float *cos_t, const float *sin_t,
                           const int32_t *seq, const int32_t *pos, int64_t NH, int64_t NKV,
                           int64_t hd, GpuKV kv) {
    pdl_sync();
    const int64_t r = blockIdx.x, half = hd / 2, KV = NKV * hd, n_rot = (NH + NKV) * half;
    const int64_t t = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    const int64_t slot = (int64_t)seq[r] * kv.max_len + pos[r];
    float *row = qkv + r * ld;
    if (t == 0) kv.valid[slot] = 1;
    if (t < n_rot) {
        const float *cs = cos_t + (int64_t)pos[r] * hd, *sn = sin_t + (int64_t)pos[r] * hd;
        const int64_t h = t / half, i = t % half;
        float *x = row + h * hd; /* key heads follow the query heads */
        const float a = x[i], b = x[i + half];
        const float ya = __fadd_rn(__fmul_rn(a, cs[i]), __fmul_rn(-b, sn[i]));
        const float yb = __fadd_rn(__fmul_rn(b, cs[i + half]), __fmul_rn(a, sn[i + half]));
        if (h < NH) {
            x[i] = ya;
            x[i + half] = yb;
        } else {
            float *kc = kv.k + slot * KV + (h - NH) * hd;
            kc[i] = ya;
            kc[i + half] = yb;
        }
    } else if (t < n_rot + KV) {
        const int64_t i = t - n_rot;
        kv.v[slot * KV + i] = row[NH * hd + KV + i];
    }
}

void gpu_rope_cache(float *qkv, int64_t ld, const float *cos_t, const float *sin_t,
                    const int32_t *seq, const int32_t *pos, int64_t M, int64_t NH, int64_t NKV,
                    int64_t hd, GpuKV kv, cudaStream_t st) {
    const int64_t work = (NH + NKV) * (hd / 2) + NKV * hd;
    const dim3 grid((unsigned)M, (unsigned)((work + THREADS - 1) / THREADS));
    launch(rope_cache, grid, dim3(THREADS), 0, st, qkv, ld, cos_t, sin_t, seq, pos, NH, NKV, hd,
           kv);
}

static const int ATT_THREADS = 256, ATT_WARPS = ATT_THREADS / 32;
static const int ATT_KEYS = 4;           /* keys per warp in flight in the scores pass */
static const int64_t ATT_MIN_SPLIT = 64; /* key slots per split at least */
static const int64_t ATT_BLOCKS = 1024;  /* splits grow a small grid to about this many blocks */
static const int64_t ATT_MAX_HD = 256;

/* Threads per key group of the p @ V pass: hd when it fits the block, else the block. */
__host__ __device__ inline int64_t att_span(int64_t hd) {
    return hd < ATT_THREADS ? hd : ATT_THREADS;
}

/* attention_split, block (row r, query head h, split s): the key slots [s L, s L + L) below
 * n = pos[r] + 1 (none: the block returns). Scores: a warp per key slot, ATT_KEYS slots per
 * warp loaded at once, lanes over the head dimensions (HDL per lane: a slot's row read
 * coalesced), a shuffle sum; softmax within the split (max m, exp, double sum l); then p @ V
 * with the threads split into key groups (group g takes slots g, g + G, ...; a thread one head
 * dimension), the G partial sums added in group order. Writes part (M, NH, S, hd + 2): the
 * unnormalized sums, m, l. Shared memory: G * hd partial sums, then one score per slot. */
template <int HDL>
__global__ void __launch_bounds__(ATT_THREADS)
    attention_split(const float *q, int64_t ld, const int32_t *seq, const int32_t *pos,
                    int64_t NH, int64_t NKV, int64_t hd, int64_t L, GpuKV kv, float *part) {
    pdl_sync();
    extern __shared__ float smem[];
    __shared__ double dsum[ATT_WARPS];
    __shared__ float fmax_[ATT_WARPS];
    const int64_t r = blockIdx.x, h = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int64_t n = (int64_t)pos[r] + 1, j0 = s * L;
    if (j0 >= n) return;
    const int64_t cnt = n - j0 < L ? n - j0 : L;
    const int64_t span = att_span(hd), G = ATT_THREADS / span;
    float *pv = smem, *sc = smem + G * hd;
    const int64_t kvh = h / (NH / NKV), KV = NKV * hd;
    const int64_t base = (int64_t)seq[r] * kv.max_len + j0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float scale = 1.0f / sqrtf((float)hd);
    float qv[HDL];
#pragma unroll
    for (int i = 0; i < HDL; i++) {
        const int64_t d = lane + 32 * i;
        qv[i] = d < hd ? q[r * ld + h * hd + d] : 0.0f;
    }
    const float *kb = kv.k + base * KV + kvh * hd;
    for (int64_t j = (int64_t)warp * ATT_KEYS; j < cnt; j += ATT_WARPS * ATT_KEYS) {
        float kr[ATT_KEYS][HDL];
        bool ok[ATT_KEYS];
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            const bool in = j + u < cnt;
            ok[u] = in && kv.valid[base + j + u];
#pragma unroll
            for (int i = 0; i < HDL; i++) {
                const int64_t d = lane + 32 * i;
                kr[u][i] = in && d < hd ? kb[(j + u) * KV + d] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < HDL; i++) dot = fmaf(qv[i], kr[u][i], dot);
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (lane == 0 && j + u < cnt) sc[j + u] = ok[u] ? dot * scale : -INFINITY;
        }
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < cnt; j += ATT_THREADS) mx = fmaxf(mx, sc[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) fmax_[warp] = mx;
    __syncthreads();
    mx = fmax_[0];
    for (int i = 1; i < ATT_WARPS; i++) mx = fmaxf(mx, fmax_[i]);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < cnt; j += ATT_THREADS) {
        const float e = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - mx); /* invalid slots: 0 */
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, dsum); /* its barriers also publish sc */
    const int64_t g = threadIdx.x / span;
    if (g < G) {
        const float *vb = kv.v + base * KV + kvh * hd;
        for (int64_t d = threadIdx.x % span; d < hd; d += span) {
            float acc = 0.0f;
#pragma unroll 4
            for (int64_t j = g; j < cnt; j += G) {
                const float p = sc[j], vv = vb[j * KV + d];
                acc = p != 0.0f ? fmaf(p, vv, acc) : acc; /* invalid slots: p == 0 */
            }
            pv[g * hd + d] = acc;
        }
    }
    __syncthreads();
    float *out = part + ((r * NH + h) * S + s) * (hd + 2);
    for (int64_t d = threadIdx.x; d < hd; d += ATT_THREADS) {
        float acc = pv[d];
        for (int64_t i = 1; i < G; i++) acc += pv[i * hd + d];
        out[d] = acc;
    }
    if (threadIdx.x == 0) {
        out[hd] = mx;
        out[hd + 1] = (float)sum;
    }
}

/* Block (row r, query head h), a thread per head dimension (blockDim: hd rounded up to whole
 * warps): the splits' sums rescaled to their common max, added in split order, divided by the
 * rescaled l; the output quantized when oq is set (hd % 32 == 0: whole warps, whole blocks). */
__global__ void attention_combine(const float *part, const int32_t *pos, int64_t NH, int64_t hd,
                                  int64_t L, int64_t S, float *out, int8_t *oq, float *od) {
    pdl_sync();
    const int64_t r = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const int64_t ns = ((int64_t)pos[r] + L) / L; /* splits holding slots <= pos */
    const float *p = part + (r * NH + h) * S * (hd + 2);
    float mx = -INFINITY;
    for (int64_t s = 0; s < ns; s++) mx = fmaxf(mx, p[s * (hd + 2) + hd]);
    double l = 0.0;
    float acc = 0.0f;
    for (int64_t s = 0; s < ns; s++) {
        const float m = p[s * (hd + 2) + hd];
        const float w = m == -INFINITY ? 0.0f : expf(m - mx); /* no valid slot: nothing */
        l += (double)w * p[s * (hd + 2) + hd + 1];
        if (d < hd && w != 0.0f) acc = fmaf(w, p[s * (hd + 2) + d], acc);
    }
    const float v = l > 0.0 ? acc * (float)(1.0 / l) : 0.0f;
    const int64_t o = r * NH * hd + h * hd + d;
    if (d < hd) out[o] = v;
    if (oq) quantize_block(v, o / 32, oq, od);
}

template <int HDL>
static void att_allow_smem(int bytes) {
    cudaFuncSetAttribute(attention_split<HDL>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

static int max_smem_bytes() {
    static int bytes = -1;
    if (bytes < 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        /* the static shared arrays of the kernel come out of the same budget */
        bytes -= 1024;
        att_allow_smem<1>(bytes);
        att_allow_smem<2>(bytes);
        att_allow_smem<4>(bytes);
        att_allow_smem<8>(bytes);
    }
    return bytes;
}

static int64_t att_smem_floats(int64_t hd) { return ATT_THREADS / att_span(hd) * hd; }

int64_t gpu_attention_max_keys(int64_t hd) { return max_smem_bytes() / 4 - att_smem_floats(hd); }

int64_t gpu_attention_max_head_dim() { return ATT_MAX_HD; }

/* Splits per (row, head): 1 when M * NH blocks fill the grid, else enough to make about
 * ATT_BLOCKS blocks, each of at least ATT_MIN_SPLIT key slots. */
static int64_t att_splits(int64_t M, int64_t NH, int64_t keys) {
    if (M * NH >= ATT_BLOCKS) return 1;
    const int64_t by_keys = (keys + ATT_MIN_SPLIT - 1) / ATT_MIN_SPLIT,
                  by_grid = ATT_BLOCKS / (M * NH);
    return by_keys < by_grid ? by_keys : by_grid;
}

int64_t gpu_attention_part_floats(int64_t M, int64_t NH, int64_t hd) {
    return (M * NH > ATT_BLOCKS ? M * NH : ATT_BLOCKS) * (hd + 2);
}

void gpu_attention(const float *q, int64_t ld, const int32_t *seq, const int32_t *pos,
                   int64_t M, int64_t NH, int64_t NKV, int64_t hd, int64_t max_pos, GpuKV kv,
                   float *part, float *out, GpuQAct xq, cudaStream_t st) {
    max_smem_bytes();
    const int64_t keys = max_pos + 1, S = att_splits(M, NH, keys), L = (keys + S - 1) / S;
    const size_t smem = (size_t)(att_smem_floats(hd) + L) * sizeof(float);
    const dim3 grid((unsigned)M, (unsigned)NH, (unsigned)S);
    if (hd <= 32) {
        launch(attention_split<1>, grid, dim3(ATT_THREADS), smem, st, q, ld, seq, pos, NH, NKV,
               hd, L, kv, part);
    } else if (hd <= 64) {
        launch(attention_split<2>, grid, dim3(ATT_THREADS), smem, st, q, ld, seq, pos, NH, NKV,
               hd, L, kv, part);
    } else if (hd <= 128) {
        launch(attention_split<4>, grid, dim3(ATT_THREADS), smem, st, q, ld, seq, pos, NH, NKV,
               hd, L, kv, part);
    } else {
        launch(attention_split<8>, grid, dim3(ATT_THREADS), smem, st, q, ld, seq, pos, NH, NKV,
               hd, L, kv, part);
    }
    launch(attention_combine, dim3((unsigned)M, (unsigned)NH), dim3((unsigned)((hd + 31) / 32 * 32)),
           0, st, (const float *)part, pos, NH, hd, L, S, out, xq.q, xq.d);
}

__global__ void clear_valid(uint8_t *valid, int64_t b, int64_t max_len) {
    pdl_sync();
    for (int64_t i = threadIdx.x; i < max_len; i += blockDim.x) valid[b * max_len + i] = 0;
}

void gpu_clear_valid(uint8_t *valid, int64_t b, int64_t max_len, cudaStream_t st) {
    launch(clear_valid, dim3(1), dim3(THREADS), 0, st, valid, b, max_len);
}

}  // namespace ats
