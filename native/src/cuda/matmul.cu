/* Matrix-vector products for decode (and, chunk by chunk, prefill): one warp per output row,
 * each lane streaming 16-byte pieces of the weight row (coalesced across the warp), UNROLL
 * pieces in flight per lane before any is used (a 2048-column int8 row is 2 KB: one round of
 * loads for the whole warp), against NR activation rows (a chunk of the N), then a
 * warp sum and an optional residual added in the epilogue. Float weights (fp32, bf16) dot fp32
 * activations; int8 / int4 weights dot Q8_0 activations in integers (dp4a), the CPU runtime's
 * scheme (kernels.h: dot_q8_packed, dot_q4_packed). A lane visits its blocks in increasing
 * order, so the per-lane float sums do not depend on UNROLL or NR. */
#include "kernels.cuh"

namespace ats {

static const int WARPS = 4;   /* output rows per block */
static const int UNROLL = 4;  /* 16-byte weight loads (int8: 32-blocks) in flight per lane */
static const int NR_BATCH = 8; /* activation rows per block when N > 1 */

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* y[n0 + r, row] = warp sum of acc[r] (+ res[n0 + r, row]); res may alias y. */
template <int NR>
__device__ __forceinline__ void store_rows(const float *acc, int lane, int nr, int64_t n0,
                                           int64_t row, int64_t ldy, const float *res,
                                           float *y) {
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && r < nr) {
            const int64_t i = (n0 + r) * ldy + row;
            y[i] = res ? res[i] + s : s;
        }
    }
}

/* fp32 weights: a lane takes 4 consecutive columns per piece (cols % 4 == 0). */
template <int NR>
__global__ void matmul_f32(const float *__restrict__ w, int64_t rows, int64_t cols,
                           const float *__restrict__ x, int64_t N, const float *res, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t chunks = (N + NR - 1) / NR;
    const int64_t row = (int64_t)blockIdx.x / chunks * WARPS + (threadIdx.x >> 5);
    const int64_t n0 = (int64_t)blockIdx.x % chunks * NR;
    if (row >= rows) return;
    const int nr = N - n0 < NR ? (int)(N - n0) : NR;
    const int64_t nk = cols / 4;
    float acc[NR] = {};
    const float4 *wr = (const float4 *)(w + row * cols);
    for (int64_t k0 = lane; k0 < nk; k0 += 32 * UNROLL) {
        float4 wv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t k = k0 + 32 * u;
            wv[u] = k < nk ? __ldg(wr + k) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r >= nr) break;
            const float4 *xr = (const float4 *)(x + (n0 + r) * cols);
            float4 xv[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int64_t k = k0 + 32 * u;
                xv[u] = k < nk ? __ldg(xr + k) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (k0 + 32 * u < nk) {
                    acc[r] += wv[u].x * xv[u].x + wv[u].y * xv[u].y + wv[u].z * xv[u].z +
                              wv[u].w * xv[u].w;
                }
            }
        }
    }
    store_rows<NR>(acc, lane, nr, n0, row, rows, res, y);
}

/* bf16 weights: a lane takes 8 consecutive columns (one 16-byte load) per piece
 * (cols % 8 == 0). */
template <int NR>
__global__ void matmul_bf16(const __nv_bfloat16 *__restrict__ w, int64_t rows, int64_t cols,
                            const float *__restrict__ x, int64_t N, const float *res, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t chunks = (N + NR - 1) / NR;
    const int64_t row = (int64_t)blockIdx.x / chunks * WARPS + (threadIdx.x >> 5);
    const int64_t n0 = (int64_t)blockIdx.x % chunks * NR;
    if (row >= rows) return;
    const int nr = N - n0 < NR ? (int)(N - n0) : NR;
    const int64_t nk = cols / 8;
    float acc[NR] = {};
    const uint4 *wr = (const uint4 *)(w + row * cols);
    for (int64_t k0 = lane; k0 < nk; k0 += 32 * UNROLL) {
        uint4 raw[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t k = k0 + 32 * u;
            raw[u] = k < nk ? __ldg(wr + k) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r >= nr) break;
            const float4 *xr = (const float4 *)(x + (n0 + r) * cols);
            float4 xa[UNROLL], xb[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int64_t k = k0 + 32 * u;
                xa[u] = k < nk ? __ldg(xr + 2 * k) : make_float4(0.f, 0.f, 0.f, 0.f);
                xb[u] = k < nk ? __ldg(xr + 2 * k + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (k0 + 32 * u >= nk) continue;
                const __nv_bfloat162 *p = (const __nv_bfloat162 *)&raw[u];
                const float2 f0 = __bfloat1622float2(p[0]), f1 = __bfloat1622float2(p[1]);
                const float2 f2 = __bfloat1622float2(p[2]), f3 = __bfloat1622float2(p[3]);
                const float4 a = xa[u], b = xb[u];
                acc[r] += f0.x * a.x + f0.y * a.y + f1.x * a.z + f1.y * a.w + f2.x * b.x +
                          f2.y * b.y + f3.x * b.z + f3.y * b.w;
            }
        }
    }
    store_rows<NR>(acc, lane, nr, n0, row, rows, res, y);
}

__device__ __forceinline__ int dot32(int4 w0, int4 w1, int4 x0, int4 x1) {
    int dot = __dp4a(w0.x, x0.x, 0);
    dot = __dp4a(w0.y, x0.y, dot);
    dot = __dp4a(w0.z, x0.z, dot);
    dot = __dp4a(w0.w, x0.w, dot);
    dot = __dp4a(w1.x, x1.x, dot);
    dot = __dp4a(w1.y, x1.y, dot);
    dot = __dp4a(w1.z, x1.z, dot);
    return __dp4a(w1.w, x1.w, dot);
}

/* The NR activation rows' Q8_0 codes and scales of blocks k0 + 32 u (u < UNROLL) of row r:
 * loaded together so their latencies overlap. */
struct QActPieces {
    int4 x0[UNROLL], x1[UNROLL];
    float d[UNROLL];
};

__device__ __forceinline__ void load_qact(const int8_t *__restrict__ xq,
                                          const float *__restrict__ xd, int64_t cols,
                                          int64_t n, int64_t k0, int64_t nb, QActPieces *p) {
    const int4 *xr = (const int4 *)(xq + n * cols);
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int64_t b = k0 + 32 * u;
        const int4 z = make_int4(0, 0, 0, 0);
        p->x0[u] = b < nb ? __ldg(xr + 2 * b) : z;
        p->x1[u] = b < nb ? __ldg(xr + 2 * b + 1) : z;
        p->d[u] = b < nb ? __ldg(xd + n * nb + b) : 0.0f;
    }
}

/* int8 weights, Q8_0 activations: a lane takes whole 32-blocks; per block an exact integer dot,
 * acc = fma(dot, d_block, acc); the row scale once at the end (dot_q8_packed's order of
 * operations per block). */
template <int NR>
__global__ void matmul_q8(const int8_t *__restrict__ w, const float *__restrict__ scale,
                          int64_t rows, int64_t cols, const int8_t *__restrict__ xq,
                          const float *__restrict__ xd, int64_t N, const float *res, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t chunks = (N + NR - 1) / NR;
    const int64_t row = (int64_t)blockIdx.x / chunks * WARPS + (threadIdx.x >> 5);
    const int64_t n0 = (int64_t)blockIdx.x % chunks * NR;
    if (row >= rows) return;
    const int nr = N - n0 < NR ? (int)(N - n0) : NR;
    const int64_t nb = cols / 32;
    float acc[NR] = {};
    const int4 *wr = (const int4 *)(w + row * cols);
    for (int64_t k0 = lane; k0 < nb; k0 += 32 * UNROLL) {
        int4 w0[UNROLL], w1[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t b = k0 + 32 * u;
            const int4 z = make_int4(0, 0, 0, 0);
            w0[u] = b < nb ? __ldg(wr + 2 * b) : z;
            w1[u] = b < nb ? __ldg(wr + 2 * b + 1) : z;
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r >= nr) break;
            QActPieces p;
            load_qact(xq, xd, cols, n0 + r, k0, nb, &p);
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (k0 + 32 * u < nb) {
                    acc[r] = fmaf((float)dot32(w0[u], w1[u], p.x0[u], p.x1[u]), p.d[u], acc[r]);
                }
            }
        }
    }
    const float s = __ldg(scale + row);
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] *= s;
    store_rows<NR>(acc, lane, nr, n0, row, rows, res, y);
}

/* int4 weights (16 bytes per 32-block: low nibbles elements 0..15, high 16..31), Q8_0
 * activations: dot = sum(c * q) - 8 * sum(q) exactly, acc = fma(dot, scale_fp16 * d, acc)
 * (dot_q4_packed's order of operations per block). */
template <int NR>
__global__ void matmul_q4(const uint8_t *__restrict__ w, const __half *__restrict__ scale,
                          int group, int64_t rows, int64_t cols, const int8_t *__restrict__ xq,
                          const float *__restrict__ xd, int64_t N, const float *res, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t chunks = (N + NR - 1) / NR;
    const int64_t row = (int64_t)blockIdx.x / chunks * WARPS + (threadIdx.x >> 5);
    const int64_t n0 = (int64_t)blockIdx.x % chunks * NR;
    if (row >= rows) return;
    const int nr = N - n0 < NR ? (int)(N - n0) : NR;
    const int64_t nb = cols / 32, per_group = group / 32, ng = cols / group;
    float acc[NR] = {};
    const int4 *wr = (const int4 *)(w + row * nb * 16);
    for (int64_t k0 = lane; k0 < nb; k0 += 32 * UNROLL) {
        int4 lo[UNROLL], hi[UNROLL];
        float ws[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t b = k0 + 32 * u;
            const int4 c = b < nb ? __ldg(wr + b) : make_int4(0, 0, 0, 0);
            ws[u] = b < nb ? __half2float(__ldg(scale + row * ng + b / per_group)) : 0.0f;
            lo[u] = make_int4(c.x & 0x0F0F0F0F, c.y & 0x0F0F0F0F, c.z & 0x0F0F0F0F,
                              c.w & 0x0F0F0F0F);
            hi[u] = make_int4((c.x >> 4) & 0x0F0F0F0F, (c.y >> 4) & 0x0F0F0F0F,
                              (c.z >> 4) & 0x0F0F0F0F, (c.w >> 4) & 0x0F0F0F0F);
        }
        const int4 ones = make_int4(0x01010101, 0x01010101, 0x01010101, 0x01010101);
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r >= nr) break;
            QActPieces p;
            load_qact(xq, xd, cols, n0 + r, k0, nb, &p); /* x0: elements 0..15, x1: 16..31 */
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (k0 + 32 * u < nb) {
                    const int dot = dot32(lo[u], hi[u], p.x0[u], p.x1[u]) -
                                    8 * dot32(ones, ones, p.x0[u], p.x1[u]);
                    acc[r] = fmaf((float)dot, ws[u] * p.d[u], acc[r]);
                }
            }
        }
    }
    store_rows<NR>(acc, lane, nr, n0, row, rows, res, y);
}

template <int NR>
static void launch_matmul(const GpuWeight &w, const float *x, const GpuQAct &xq, int64_t N,
                          float *y, const float *res, cudaStream_t st) {
    /* block b: output rows (b / chunks) * WARPS.., activation rows (b % chunks) * NR..: the
     * chunks of one weight row group run back to back, its later reads hitting L2 */
    const int64_t chunks = (N + NR - 1) / NR;
    const unsigned grid = (unsigned)((w.rows + WARPS - 1) / WARPS * chunks);
    const int threads = WARPS * 32;
    switch (w.type) {
    case GPU_F32:
        matmul_f32<NR><<<grid, threads, 0, st>>>((const float *)w.data, w.rows, w.cols, x, N,
                                                 res, y);
        break;
    case GPU_BF16:
        matmul_bf16<NR><<<grid, threads, 0, st>>>((const __nv_bfloat16 *)w.data, w.rows, w.cols,
                                                  x, N, res, y);
        break;
    case GPU_Q8:
        matmul_q8<NR><<<grid, threads, 0, st>>>((const int8_t *)w.data, w.scale, w.rows, w.cols,
                                                xq.q, xq.d, N, res, y);
        break;
    case GPU_Q4:
        matmul_q4<NR><<<grid, threads, 0, st>>>((const uint8_t *)w.data, w.scale4, w.group,
                                                w.rows, w.cols, xq.q, xq.d, N, res, y);
        break;
    }
}

void gpu_matmul(const GpuWeight &w, const float *x, const GpuQAct &xq, int64_t N, float *y,
                cudaStream_t st, const float *res) {
    if (N == 1) {
        launch_matmul<1>(w, x, xq, N, y, res, st);
    } else {
        launch_matmul<NR_BATCH>(w, x, xq, N, y, res, st);
    }
}

/* One warp per 32-block: the CPU's quantize_q8_0_scalar (d = amax / 127, q = rint(x * 127 /
 * amax), round half to even, clamped to [-127, 127]). */
__global__ void quantize_q8_0(const float *__restrict__ x, int64_t n_blocks, int8_t *q, float *d) {
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (b >= n_blocks) return;
    quantize_block(x[b * 32 + (threadIdx.x & 31)], b, q, d);
}

void gpu_quantize(const float *x, int64_t N, int64_t C, GpuQAct xq, cudaStream_t st) {
    const int64_t n_blocks = N * C / 32;
    const int per = 8; /* 32-blocks per thread block */
    quantize_q8_0<<<(unsigned)((n_blocks + per - 1) / per), per * 32, 0, st>>>(x, n_blocks, xq.q,
                                                                              xq.d);
}

}  // namespace ats
