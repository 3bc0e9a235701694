/* Matrix-vector products for decode (and, chunk by chunk, prefill): a warp per RPW output rows,
 * each lane streaming 16-byte pieces of the weight rows (coalesced across the warp), UN pieces
 * per row, RPW * UN in flight per lane before any is used (decode: 4 rows of a 2048-column int8
 * row, 8 KB, in one round of loads for the whole warp; the activation pieces loaded once for
 * the RPW rows), against NR activation rows (a chunk of the N), then a warp sum per row and an
 * optional residual added in the epilogue. Float weights (fp32, bf16) dot fp32 activations;
 * int8 / int4 weights dot Q8_0 activations in integers (dp4a), the CPU runtime's scheme
 * (kernels.h: dot_q8_packed, dot_q4_packed). A lane visits its blocks in increasing order, so
 * the per-lane float sums do not depend on UN, RPW or NR. */
#include "kernels.cuh"

namespace ats {

static const int WARPS = 4;    /* warps per block */
static const int NR_BATCH = 8; /* activation rows per block when N > 1 (RPW 1, UN 4) */
static const int RPW_DECODE = 4, UN_DECODE = 2; /* N == 1 */

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

/* A warp's task: its first output row, its activation rows n0.. (nr of them). Task t (of
 * ceil(rows / RPW) * chunks) is row group t / chunks, activation chunk t % chunks: the chunks
 * of one row group run back to back, its later reads hitting L2. */
struct WarpRows {
    int64_t row0, n0;
    int nr;
};

template <int NR, int RPW>
__device__ __forceinline__ WarpRows warp_rows(int64_t t, int64_t N) {
    const int64_t chunks = (N + NR - 1) / NR;
    WarpRows w;
    w.row0 = t / chunks * RPW;
    w.n0 = t % chunks * NR;
    w.nr = N - w.n0 < NR ? (int)(N - w.n0) : NR;
    return w;
}

/* The grid's warps loop over the tasks (a grid of the blocks that fit the GPU at once: no
 * partial last wave of short blocks). */
template <int NR, int RPW>
__device__ __forceinline__ int64_t task_count(int64_t rows, int64_t N) {
    return (rows + RPW - 1) / RPW * ((N + NR - 1) / NR);
}

__device__ __forceinline__ int64_t first_task() {
    return (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
}

/* Rows past the last load the last row again (their sums are never stored). */
__device__ __forceinline__ int64_t clamp_row(int64_t row, int64_t rows) {
    return row < rows ? row : rows - 1;
}

/* Sums acc[rr] of rows row0 + rr scaled by scale[row] when scale is not NULL, stored. */
template <int NR, int RPW>
__device__ __forceinline__ void store_all(float (*acc)[NR], const float *scale, int lane,
                                          const WarpRows &w, int64_t rows, const float *res,
                                          float *y) {
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int64_t row = w.row0 + rr;
        if (row >= rows) break;
        if (scale) {
            const float s = __ldg(scale + row);
#pragma unroll
            for (int r = 0; r < NR; r++) acc[rr][r] *= s;
        }
        store_rows<NR>(acc[rr], lane, w.nr, w.n0, row, rows, res, y);
    }
}

/* fp32 weights: a lane takes 4 consecutive columns per piece (cols % 4 == 0). */
template <int NR, int RPW, int UN>
__global__ void __launch_bounds__(WARPS * 32, NR == 1 ? 4 : 1)
    matmul_f32(const float *__restrict__ w, int64_t rows, int64_t cols, const float *__restrict__ x,
               int64_t N, const float *res, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t n_tasks = task_count<NR, RPW>(rows, N);
    for (int64_t t = first_task(); t < n_tasks; t += (int64_t)gridDim.x * WARPS) {
        const WarpRows wr = warp_rows<NR, RPW>(t, N);
        const int64_t nk = cols / 4;
        float acc[RPW][NR] = {};
        for (int64_t k0 = lane; k0 < nk; k0 += 32 * UN) {
            float4 wv[RPW][UN];
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const float4 *wp = (const float4 *)(w + clamp_row(wr.row0 + rr, rows) * cols);
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    const int64_t k = k0 + 32 * u;
                    wv[rr][u] = k < nk ? __ldg(wp + k) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if (r >= wr.nr) break;
                const float4 *xr = (const float4 *)(x + (wr.n0 + r) * cols);
                float4 xv[UN];
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    const int64_t k = k0 + 32 * u;
                    xv[u] = k < nk ? __ldg(xr + k) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) {
#pragma unroll
                    for (int u = 0; u < UN; u++) {
                        if (k0 + 32 * u < nk) {
                            const float4 a = wv[rr][u], b = xv[u];
                            acc[rr][r] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                        }
                    }
                }
            }
        }
        store_all<NR, RPW>(acc, nullptr, lane, wr, rows, res, y);
    }
}

/* bf16 weights: a lane takes 8 consecutive columns (one 16-byte load) per piece
 * (cols % 8 == 0). */
template <int NR, int RPW, int UN>
__global__ void __launch_bounds__(WARPS * 32, NR == 1 ? 4 : 1)
    matmul_bf16(const __nv_bfloat16 *__restrict__ w, int64_t rows, int64_t cols,
                const float *__restrict__ x, int64_t N, const float *res, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t n_tasks = task_count<NR, RPW>(rows, N);
    for (int64_t t = first_task(); t < n_tasks; t += (int64_t)gridDim.x * WARPS) {
        const WarpRows wr = warp_rows<NR, RPW>(t, N);
        const int64_t nk = cols / 8;
        float acc[RPW][NR] = {};
        for (int64_t k0 = lane; k0 < nk; k0 += 32 * UN) {
            uint4 raw[RPW][UN];
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const uint4 *wp = (const uint4 *)(w + clamp_row(wr.row0 + rr, rows) * cols);
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    const int64_t k = k0 + 32 * u;
                    raw[rr][u] = k < nk ? __ldg(wp + k) : make_uint4(0u, 0u, 0u, 0u);
                }
            }
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if (r >= wr.nr) break;
                const float4 *xr = (const float4 *)(x + (wr.n0 + r) * cols);
                float4 xa[UN], xb[UN];
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    const int64_t k = k0 + 32 * u;
                    xa[u] = k < nk ? __ldg(xr + 2 * k) : make_float4(0.f, 0.f, 0.f, 0.f);
                    xb[u] = k < nk ? __ldg(xr + 2 * k + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) {
#pragma unroll
                    for (int u = 0; u < UN; u++) {
                        if (k0 + 32 * u >= nk) continue;
                        const __nv_bfloat162 *p = (const __nv_bfloat162 *)&raw[rr][u];
                        const float2 f0 = __bfloat1622float2(p[0]), f1 = __bfloat1622float2(p[1]);
                        const float2 f2 = __bfloat1622float2(p[2]), f3 = __bfloat1622float2(p[3]);
                        const float4 a = xa[u], b = xb[u];
                        acc[rr][r] += f0.x * a.x + f0.y * a.y + f1.x * a.z + f1.y * a.w +
                                      f2.x * b.x + f2.y * b.y + f3.x * b.z + f3.y * b.w;
                    }
                }
            }
        }
        store_all<NR, RPW>(acc, nullptr, lane, wr, rows, res, y);
    }
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

/* The Q8_0 codes and scales of blocks k0 + 32 u (u < UN) of activation row n: loaded
 * together so their latencies overlap. */
template <int UN>
struct QActPieces {
    int4 x0[UN], x1[UN];
    float d[UN];
};

template <int UN>
__device__ __forceinline__ void load_qact(const int8_t *__restrict__ xq,
                                          const float *__restrict__ xd, int64_t cols,
                                          int64_t n, int64_t k0, int64_t nb, QActPieces<UN> *p) {
    const int4 *xr = (const int4 *)(xq + n * cols);
#pragma unroll
    for (int u = 0; u < UN; u++) {
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
template <int NR, int RPW, int UN>
__global__ void __launch_bounds__(WARPS * 32, NR == 1 ? 4 : 1)
    matmul_q8(const int8_t *__restrict__ w, const float *__restrict__ scale, int64_t rows,
              int64_t cols, const int8_t *__restrict__ xq, const float *__restrict__ xd, int64_t N,
              const float *res, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t n_tasks = task_count<NR, RPW>(rows, N);
    for (int64_t t = first_task(); t < n_tasks; t += (int64_t)gridDim.x * WARPS) {
        const WarpRows wr = warp_rows<NR, RPW>(t, N);
        const int64_t nb = cols / 32;
        float acc[RPW][NR] = {};
        for (int64_t k0 = lane; k0 < nb; k0 += 32 * UN) {
            int4 w0[RPW][UN], w1[RPW][UN];
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const int4 *wp = (const int4 *)(w + clamp_row(wr.row0 + rr, rows) * cols);
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    const int64_t b = k0 + 32 * u;
                    const int4 z = make_int4(0, 0, 0, 0);
                    w0[rr][u] = b < nb ? __ldg(wp + 2 * b) : z;
                    w1[rr][u] = b < nb ? __ldg(wp + 2 * b + 1) : z;
                }
            }
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if (r >= wr.nr) break;
                QActPieces<UN> p;
                load_qact<UN>(xq, xd, cols, wr.n0 + r, k0, nb, &p);
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) {
#pragma unroll
                    for (int u = 0; u < UN; u++) {
                        if (k0 + 32 * u < nb) {
                            const int dot = dot32(w0[rr][u], w1[rr][u], p.x0[u], p.x1[u]);
                            acc[rr][r] = fmaf((float)dot, p.d[u], acc[rr][r]);
                        }
                    }
                }
            }
        }
        store_all<NR, RPW>(acc, scale, lane, wr, rows, res, y);
    }
}

/* int4 weights (16 bytes per 32-block: low nibbles elements 0..15, high 16..31), Q8_0
 * activations: dot = sum(c * q) - 8 * sum(q) exactly, acc = fma(dot, scale_fp16 * d, acc)
 * (dot_q4_packed's order of operations per block). */
template <int NR, int RPW, int UN>
__global__ void __launch_bounds__(WARPS * 32, NR == 1 ? 4 : 1)
    matmul_q4(const uint8_t *__restrict__ w, const __half *__restrict__ scale, int group,
              int64_t rows, int64_t cols, const int8_t *__restrict__ xq,
              const float *__restrict__ xd, int64_t N, const float *res, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t n_tasks = task_count<NR, RPW>(rows, N);
    for (int64_t t = first_task(); t < n_tasks; t += (int64_t)gridDim.x * WARPS) {
        const WarpRows wr = warp_rows<NR, RPW>(t, N);
        const int64_t nb = cols / 32, per_group = group / 32, ng = cols / group;
        float acc[RPW][NR] = {};
        for (int64_t k0 = lane; k0 < nb; k0 += 32 * UN) {
            int4 c[RPW][UN];
            float ws[RPW][UN];
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const int64_t row = clamp_row(wr.row0 + rr, rows);
                const int4 *wp = (const int4 *)(w + row * nb * 16);
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    const int64_t b = k0 + 32 * u;
                    c[rr][u] = b < nb ? __ldg(wp + b) : make_int4(0, 0, 0, 0);
                    ws[rr][u] =
                        b < nb ? __half2float(__ldg(scale + row * ng + b / per_group)) : 0.0f;
                }
            }
            const int4 ones = make_int4(0x01010101, 0x01010101, 0x01010101, 0x01010101);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if (r >= wr.nr) break;
                QActPieces<UN> p;
                load_qact<UN>(xq, xd, cols, wr.n0 + r, k0, nb, &p); /* x0: 0..15, x1: 16..31 */
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    if (k0 + 32 * u >= nb) continue;
                    const int qsum = dot32(ones, ones, p.x0[u], p.x1[u]);
#pragma unroll
                    for (int rr = 0; rr < RPW; rr++) {
                        const int4 cw = c[rr][u];
                        const int4 lo = make_int4(cw.x & 0x0F0F0F0F, cw.y & 0x0F0F0F0F,
                                                  cw.z & 0x0F0F0F0F, cw.w & 0x0F0F0F0F);
                        const int4 hi =
                            make_int4((cw.x >> 4) & 0x0F0F0F0F, (cw.y >> 4) & 0x0F0F0F0F,
                                      (cw.z >> 4) & 0x0F0F0F0F, (cw.w >> 4) & 0x0F0F0F0F);
                        const int dot = dot32(lo, hi, p.x0[u], p.x1[u]) - 8 * qsum;
                        acc[rr][r] = fmaf((float)dot, ws[rr][u] * p.d[u], acc[rr][r]);
                    }
                }
            }
        }
        store_all<NR, RPW>(acc, nullptr, lane, wr, rows, res, y);
    }
}

/* Blocks of kernel k (threads each) resident on the GPU at once: occupancy x SMs. */
static int64_t resident_blocks(const void *k, int threads) {
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, 0);
    return (int64_t)(per_sm > 0 ? per_sm : 1) * (sms > 0 ? sms : 1);
}

template <int NR, int RPW, int UN>
static void launch_matmul(const GpuWeight &w, const float *x, const GpuQAct &xq, int64_t N,
                          float *y, const float *res, cudaStream_t st) {
    const int threads = WARPS * 32;
    const int64_t tasks = (w.rows + RPW - 1) / RPW * ((N + NR - 1) / NR);
    const int64_t need = (tasks + WARPS - 1) / WARPS;
    switch (w.type) {
    case GPU_F32: {
        static const int64_t fit = resident_blocks((const void *)matmul_f32<NR, RPW, UN>, threads);
        matmul_f32<NR, RPW, UN><<<(unsigned)(need < fit ? need : fit), threads, 0, st>>>(
            (const float *)w.data, w.rows, w.cols, x, N, res, y);
        break;
    }
    case GPU_BF16: {
        static const int64_t fit =
            resident_blocks((const void *)matmul_bf16<NR, RPW, UN>, threads);
        matmul_bf16<NR, RPW, UN><<<(unsigned)(need < fit ? need : fit), threads, 0, st>>>(
            (const __nv_bfloat16 *)w.data, w.rows, w.cols, x, N, res, y);
        break;
    }
    case GPU_Q8: {
        static const int64_t fit = resident_blocks((const void *)matmul_q8<NR, RPW, UN>, threads);
        matmul_q8<NR, RPW, UN><<<(unsigned)(need < fit ? need : fit), threads, 0, st>>>(
            (const int8_t *)w.data, w.scale, w.rows, w.cols, xq.q, xq.d, N, res, y);
        break;
    }
    case GPU_Q4: {
        static const int64_t fit = resident_blocks((const void *)matmul_q4<NR, RPW, UN>, threads);
        matmul_q4<NR, RPW, UN><<<(unsigned)(need < fit ? need : fit), threads, 0, st>>>(
            (const uint8_t *)w.data, w.scale4, w.group, w.rows, w.cols, xq.q, xq.d, N, res, y);
        break;
    }
    }
}

void gpu_matmul(const GpuWeight &w, const float *x, const GpuQAct &xq, int64_t N, float *y,
                cudaStream_t st, const float *res) {
    if (N == 1) {
        launch_matmul<1, RPW_DECODE, UN_DECODE>(w, x, xq, N, y, res, st);
    } else {
        launch_matmul<NR_BATCH, 1, 4>(w, x, xq, N, y, res, st);
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
