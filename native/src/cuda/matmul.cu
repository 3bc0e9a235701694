/* Matrix-vector products for decode (and, chunk by chunk, prefill and batched decode of float
 * weights): one warp per output row, each lane streaming 16-byte pieces of the weight row
 * (coalesced across the warp), UNROLL pieces in flight per lane before any is used, against NR
 * activation rows (a chunk of the N), then a warp sum and an optional residual added in the
 * epilogue. Float weights (fp32, bf16) dot fp32 activations; int8 / int4 weights dot Q8_0
 * activations in integers (dp4a), the CPU runtime's scheme (kernels.h: dot_q8_packed,
 * dot_q4_packed): one activation row takes matvec_q (several weight rows per warp), several rows
 * matmul_mma (tensor cores) or, with gpu_set_mma(false), matmul_q8 / matmul_q4 here. A lane
 * visits its blocks in increasing order, so the per-lane float sums do not depend on UNROLL, NR
 * or the kernel. */
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
    pdl_sync();
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
    pdl_sync();
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
    pdl_sync();
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
    for (int r = 0; r < NR; r++) acc[r] = __fmul_rn(acc[r], s); /* never contracted */
    store_rows<NR>(acc, lane, nr, n0, row, rows, res, y);
}

/* int4 weights (16 bytes per 32-block: low nibbles elements 0..15, high 16..31), Q8_0
 * activations: dot = sum(c * q) - 8 * sum(q) exactly, acc = fma(dot, scale_fp16 * d, acc)
 * (dot_q4_packed's order of operations per block). */
template <int NR>
__global__ void matmul_q4(const uint8_t *__restrict__ w, const __half *__restrict__ scale,
                          int group, int64_t rows, int64_t cols, const int8_t *__restrict__ xq,
                          const float *__restrict__ xd, int64_t N, const float *res, float *y) {
    pdl_sync();
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
                    acc[r] = fmaf((float)dot, __fmul_rn(ws[u], p.d[u]), acc[r]);
                }
            }
        }
    }
    store_rows<NR>(acc, lane, nr, n0, row, rows, res, y);
}

/* One activation row (decode) of int8 / int4 weights: each warp takes R consecutive output rows,
 * lane l holding strand l of every one of them (blocks l, l + 32, l + 64, ... of the row, in
 * increasing order, fma(dot, d, acc) per block, then the int8 row scale, then the warp's xor
 * shuffle tree: the same order as matmul_q8 / matmul_q4 and the tensor-core kernel, so all three
 * give the same bits). A lane issues every 16-byte weight load of a round (U blocks of each of
 * the R rows, with the int8 row scales or int4 group scales) before any math, and before
 * pdl_sync: weights are never written, so under programmatic dependent launch they stream in
 * while the previous kernel finishes; the activation blocks (shared by the R rows) are loaded
 * after it, by coherent loads (ld_act). Weight loads bypass L1 (read once), leaving it to the activations. The launcher
 * picks R so that large matrices keep several KB of loads in flight per warp and small ones
 * still spread over every SM, and U to cover a row's blocks per lane in one round when the
 * registers allow (launch_matvec_q). */
__device__ __forceinline__ int4 ld_stream(const void *p) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Coherent loads of activations written by the previous kernel: ptxas moves non-coherent
 * (ld.global.nc, __ldg) loads above griddepcontrol.wait when other loads precede it (seen in the
 * SASS of matvec_q), which under PDL reads them before that kernel has written them. */
__device__ __forceinline__ int4 ld_act(const void *p) {
    int4 v;
    asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ float ld_act(const float *p) {
    float v;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}

static const int MV_WARPS = 4; /* warps per block of matvec_q */

template <bool Q4, int R, int U>
__global__ void __launch_bounds__(MV_WARPS * 32)
    matvec_q(const uint8_t *__restrict__ w, const float *__restrict__ scale,
             const __half *__restrict__ scale4, int group, int64_t rows, int64_t cols,
             const int8_t *__restrict__ xq, const float *__restrict__ xd, const float *res,
             float *y) {
    constexpr int P = Q4 ? 1 : 2; /* 16-byte pieces per 32-block */
    const int lane = threadIdx.x & 31;
    const int64_t row0 = ((int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= rows) {
        pdl_sync();
        return;
    }
    const int64_t nb = cols / 32, ng = Q4 ? cols / group : 1, per_group = Q4 ? group / 32 : 1;
    const int64_t rounds = (nb + 31) / 32; /* blocks per strand, at most */
    const uint8_t *wr[R];
    int64_t sr[R]; /* int4: the row's first group scale */
    float acc[R], rs[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t row = row0 + r < rows ? row0 + r : rows - 1; /* past the end: not stored */
        wr[r] = w + row * (Q4 ? nb * 16 : cols);
        sr[r] = row * ng;
        acc[r] = 0.0f;
        rs[r] = Q4 ? 1.0f : __ldg(scale + row);
    }
    for (int64_t j0 = 0; j0 < rounds; j0 += U) {
        int4 wv[R][U][P];
        float ws[R][U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t b = lane + 32 * (j0 + u);
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int p = 0; p < P; p++) {
                    wv[r][u][p] = b < nb ? ld_stream(wr[r] + (b * P + p) * 16)
                                         : make_int4(0, 0, 0, 0);
                }
                ws[r][u] = Q4 && b < nb
                               ? __half2float(__ldg(scale4 + sr[r] + b / per_group))
                               : 1.0f;
            }
        }
        if (j0 == 0) pdl_sync();
        int4 x0[U], x1[U];
        float d[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t b = lane + 32 * (j0 + u);
            const int4 z = make_int4(0, 0, 0, 0);
            x0[u] = b < nb ? ld_act((const int4 *)xq + 2 * b) : z;
            x1[u] = b < nb ? ld_act((const int4 *)xq + 2 * b + 1) : z;
            d[u] = b < nb ? ld_act(xd + b) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (lane + 32 * (j0 + u) >= nb) continue;
            if (!Q4) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    acc[r] = fmaf((float)dot32(wv[r][u][0], wv[r][u][1], x0[u], x1[u]), d[u],
                                  acc[r]);
                }
            } else {
                const int4 ones = make_int4(0x01010101, 0x01010101, 0x01010101, 0x01010101);
                const int sx = 8 * dot32(ones, ones, x0[u], x1[u]);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int4 c = wv[r][u][0];
                    const int4 lo = make_int4(c.x & 0x0F0F0F0F, c.y & 0x0F0F0F0F,
                                              c.z & 0x0F0F0F0F, c.w & 0x0F0F0F0F);
                    const int4 hi =
                        make_int4((c.x >> 4) & 0x0F0F0F0F, (c.y >> 4) & 0x0F0F0F0F,
                                  (c.z >> 4) & 0x0F0F0F0F, (c.w >> 4) & 0x0F0F0F0F);
                    const int dot = dot32(lo, hi, x0[u], x1[u]) - sx;
                    acc[r] = fmaf((float)dot, __fmul_rn(ws[r][u], d[u]), acc[r]);
                }
            }
        }
    }
    float out = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float s = warp_sum(Q4 ? acc[r] : __fmul_rn(acc[r], rs[r])); /* never contracted */
        if (lane == r) out = s;
    }
    const int64_t row = row0 + lane;
    if (lane < R && row < rows) y[row] = res ? res[row] + out : out;
}

template <bool Q4, int R, int U>
static void launch_matvec(const GpuWeight &w, const GpuQAct &xq, float *y, const float *res,
                          cudaStream_t st) {
    const int64_t per_block = (int64_t)MV_WARPS * R;
    launch(matvec_q<Q4, R, U>, dim3((unsigned)((w.rows + per_block - 1) / per_block)),
           dim3(MV_WARPS * 32), 0, st, (const uint8_t *)w.data, w.scale, w.scale4, w.group,
           w.rows, w.cols, (const int8_t *)xq.q, (const float *)xq.d, res, y);
}

/* U = a lane's blocks per row and round, 2 or 4 (4 when a lane has more than 2 blocks); then R
 * as large as the registers allow (16 weight pieces per lane and round: R <= 4 int8 / 8 int4)
 * while leaving >= 2816 warps (~21 per SM of 132). dense-1b int8 takes R = 4 for w1 / w3 and
 * the output projection, R = 1 for the rest; int4 R = 4 for w1 / w3, 8 for the output. U = 8 (w2's 5632 columns
 * in one round) would take ~150 registers, 3 blocks per SM, 2 waves for w2's 512 blocks. */
template <bool Q4>
static void launch_matvec_q(const GpuWeight &w, const GpuQAct &xq, float *y, const float *res,
                            cudaStream_t st) {
    const int64_t per_lane = (w.cols / 32 + 31) / 32;
    const int u = per_lane <= 2 ? 2 : 4, P = Q4 ? 1 : 2;
    int r = Q4 ? 8 : 4;
    while (r > 1 && (r * u * P > 16 || w.rows / r < 2816)) r /= 2;
    const bool u4 = u == 4;
    switch (r) {
    case 8: launch_matvec<Q4, (Q4 ? 8 : 4), 2>(w, xq, y, res, st); break;
    case 4:
        if (u4) launch_matvec<Q4, 4, (Q4 ? 4 : 2)>(w, xq, y, res, st);
        else launch_matvec<Q4, 4, 2>(w, xq, y, res, st);
        break;
    case 2:
        if (u4) launch_matvec<Q4, 2, 4>(w, xq, y, res, st);
        else launch_matvec<Q4, 2, 2>(w, xq, y, res, st);
        break;
    default:
        if (u4) launch_matvec<Q4, 1, 4>(w, xq, y, res, st);
        else launch_matvec<Q4, 1, 2>(w, xq, y, res, st);
        break;
    }
}

/* Batched int8 / int4 matmul (N > 1 activation rows) on the tensor cores: mma.sync m16n8k32
 * (s8 x s8 -> s32), one mma per Q8_0 block, so each block's integer dot is exact as in the
 * warp kernels above, then scaled in float. A thread block takes 16 output rows and NT tiles
 * of 8 activation rows; its MMA_WARPS warps split the 32-blocks of the row the way the warp
 * kernel's lanes do: "strand" l (l < 32) takes blocks l, l + 32, l + 64, ... in increasing
 * order (fma(dot, d, acc) per block, then the int8 row scale), warp w holding strands w, w + 8,
 * w + 16, w + 24, and the 32 strand sums are added in the warp kernel's shuffle tree (xor 16,
 * 8, 4, 2, 1: the first two levels inside each warp, the rest through shared memory). Every
 * output is therefore bit-identical to the N = 1 warp kernel's (a decode step and the prefill
 * of the same tokens agree exactly), whichever N computed it.
 * Fragments (PTX m16n8k32 .s8, g = lane / 4, t = lane % 4): A reg 0..3 = (row g, k 4t..),
 * (row g + 8, k 4t..), (row g, k 16 + 4t..), (row g + 8, k 16 + 4t..); B reg 0, 1 = (column g,
 * k 4t.., 16 + 4t..); D reg i = (row g + 8 (i / 2), column 2t + i % 2). The int8 path permutes
 * k within the block (k 4t + i <-> byte 8t + i, 16 + 4t + i <-> byte 8t + 4 + i, the same for A
 * and B) so a lane reads 8 consecutive bytes of each; int4's bytes 4t.. hold exactly elements
 * 4t.. (low nibbles) and 16 + 4t.. (high), the standard order. */
static const int MMA_WARPS = 8;

__device__ __forceinline__ void mma_s8(int *c, const unsigned *a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

template <bool Q4, int NT>
__global__ void __launch_bounds__(MMA_WARPS * 32)
    matmul_mma(const uint8_t *__restrict__ w, const float *__restrict__ scale,
               const __half *__restrict__ scale4, int group, int64_t rows, int64_t cols,
               const int8_t *__restrict__ xq, const float *__restrict__ xd, int64_t N,
               const float *res, float *y) {
    __shared__ float part[MMA_WARPS][16][NT * 8];
    pdl_sync();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * 16, n0 = (int64_t)blockIdx.y * NT * 8;
    const int64_t nb = cols / 32, per_group = Q4 ? group / 32 : 1, ng = Q4 ? cols / group : 1;
    /* rows and activation rows past the end repeat the last one (never stored) */
    const int64_t ra = row0 + g < rows ? row0 + g : rows - 1;
    const int64_t rb = row0 + g + 8 < rows ? row0 + g + 8 : rows - 1;
    int64_t tb[NT], td0[NT], td1[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int64_t base = n0 + nt * 8;
        tb[nt] = base + g < N ? base + g : N - 1;
        td0[nt] = base + 2 * t < N ? base + 2 * t : N - 1;
        td1[nt] = base + 2 * t + 1 < N ? base + 2 * t + 1 : N - 1;
    }
    float acc[4][NT][4];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[j][nt][i] = 0.0f;
    for (int64_t b0 = warp; b0 < nb; b0 += 32) {
#pragma unroll
        for (int j = 0; j < 4; j++) { /* strand warp + 8 j: block b0 + 8 j */
            const int64_t b = b0 + 8 * j;
            if (b < nb) {
                unsigned a[4];
                float wsa = 1.0f, wsb = 1.0f;
                if (!Q4) {
                    const uint2 pa = __ldg((const uint2 *)(w + ra * cols + b * 32 + 8 * t));
                    const uint2 pb = __ldg((const uint2 *)(w + rb * cols + b * 32 + 8 * t));
                    a[0] = pa.x, a[1] = pb.x, a[2] = pa.y, a[3] = pb.y;
                } else {
                    const unsigned ca = __ldg((const unsigned *)(w + (ra * nb + b) * 16 + 4 * t));
                    const unsigned cb = __ldg((const unsigned *)(w + (rb * nb + b) * 16 + 4 * t));
                    a[0] = __vsub4(ca & 0x0F0F0F0Fu, 0x08080808u);
                    a[1] = __vsub4(cb & 0x0F0F0F0Fu, 0x08080808u);
                    a[2] = __vsub4((ca >> 4) & 0x0F0F0F0Fu, 0x08080808u);
                    a[3] = __vsub4((cb >> 4) & 0x0F0F0F0Fu, 0x08080808u);
                    wsa = __half2float(__ldg(scale4 + ra * ng + b / per_group));
                    wsb = __half2float(__ldg(scale4 + rb * ng + b / per_group));
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    unsigned x0, x1;
                    if (!Q4) {
                        const uint2 px = __ldg((const uint2 *)(xq + tb[nt] * cols + b * 32 + 8 * t));
                        x0 = px.x, x1 = px.y;
                    } else {
                        const int8_t *xr = xq + tb[nt] * cols + b * 32 + 4 * t;
                        x0 = __ldg((const unsigned *)xr);
                        x1 = __ldg((const unsigned *)(xr + 16));
                    }
                    const float d0 = __ldg(xd + td0[nt] * nb + b), d1 = __ldg(xd + td1[nt] * nb + b);
                    int c[4];
                    mma_s8(c, a, x0, x1);
                    if (!Q4) {
                        acc[j][nt][0] = fmaf((float)c[0], d0, acc[j][nt][0]);
                        acc[j][nt][1] = fmaf((float)c[1], d1, acc[j][nt][1]);
                        acc[j][nt][2] = fmaf((float)c[2], d0, acc[j][nt][2]);
                        acc[j][nt][3] = fmaf((float)c[3], d1, acc[j][nt][3]);
                    } else {
                        acc[j][nt][0] = fmaf((float)c[0], __fmul_rn(wsa, d0), acc[j][nt][0]);
                        acc[j][nt][1] = fmaf((float)c[1], __fmul_rn(wsa, d1), acc[j][nt][1]);
                        acc[j][nt][2] = fmaf((float)c[2], __fmul_rn(wsb, d0), acc[j][nt][2]);
                        acc[j][nt][3] = fmaf((float)c[3], __fmul_rn(wsb, d1), acc[j][nt][3]);
                    }
                }
            }
        }
    }
    /* v_l = strand sum (times the int8 row scale); this warp's tree node
     * (v_w + v_w+16) + (v_w+8 + v_w+24) */
    const float sa = Q4 ? 1.0f : __ldg(scale + ra), sb = Q4 ? 1.0f : __ldg(scale + rb);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                v[j] = Q4 ? acc[j][nt][i] : __fmul_rn(acc[j][nt][i], i < 2 ? sa : sb);
            }
            part[warp][g + 8 * (i >> 1)][nt * 8 + 2 * t + (i & 1)] =
                __fadd_rn(__fadd_rn(v[0], v[2]), __fadd_rn(v[1], v[3]));
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < 16 * NT * 8; idx += MMA_WARPS * 32) {
        const int r = idx / (NT * 8), col = idx % (NT * 8);
        const int64_t row = row0 + r, n = n0 + col;
        if (row >= rows || n >= N) continue;
        float c4[4];
#pragma unroll
        for (int k = 0; k < 4; k++) c4[k] = __fadd_rn(part[k][r][col], part[k + 4][r][col]);
        const float s = __fadd_rn(__fadd_rn(c4[0], c4[2]), __fadd_rn(c4[1], c4[3]));
        const int64_t o = n * rows + row;
        y[o] = res ? __fadd_rn(res[o], s) : s;
    }
}

template <bool Q4>
static void launch_mma(const GpuWeight &w, const GpuQAct &xq, int64_t N, float *y,
                       const float *res, cudaStream_t st) {
    const unsigned gx = (unsigned)((w.rows + 15) / 16);
    const dim3 block(MMA_WARPS * 32);
    const uint8_t *wd = (const uint8_t *)w.data;
    if (N <= 8) {
        launch(matmul_mma<Q4, 1>, dim3(gx, 1), block, 0, st, wd, w.scale, w.scale4, w.group,
               w.rows, w.cols, (const int8_t *)xq.q, (const float *)xq.d, N, res, y);
    } else if (N <= 16) {
        launch(matmul_mma<Q4, 2>, dim3(gx, 1), block, 0, st, wd, w.scale, w.scale4, w.group,
               w.rows, w.cols, (const int8_t *)xq.q, (const float *)xq.d, N, res, y);
    } else {
        launch(matmul_mma<Q4, 4>, dim3(gx, (unsigned)((N + 31) / 32)), block, 0, st, wd, w.scale,
               w.scale4, w.group, w.rows, w.cols, (const int8_t *)xq.q, (const float *)xq.d, N,
               res, y);
    }
}

template <int NR>
static void launch_matmul(const GpuWeight &w, const float *x, const GpuQAct &xq, int64_t N,
                          float *y, const float *res, cudaStream_t st) {
    /* block b: output rows (b / chunks) * WARPS.., activation rows (b % chunks) * NR..: the
     * chunks of one weight row group run back to back, its later reads hitting L2 */
    const int64_t chunks = (N + NR - 1) / NR;
    const unsigned grid = (unsigned)((w.rows + WARPS - 1) / WARPS * chunks);
    const int threads = WARPS * 32;
    const dim3 g(grid), b(threads);
    switch (w.type) {
    case GPU_F32:
        launch(matmul_f32<NR>, g, b, 0, st, (const float *)w.data, w.rows, w.cols, x, N, res, y);
        break;
    case GPU_BF16:
        launch(matmul_bf16<NR>, g, b, 0, st, (const __nv_bfloat16 *)w.data, w.rows, w.cols, x, N,
               res, y);
        break;
    case GPU_Q8: /* N > 1 only (one row: matvec_q) */
        if constexpr (NR > 1)
            launch(matmul_q8<NR>, g, b, 0, st, (const int8_t *)w.data, w.scale, w.rows, w.cols,
               (const int8_t *)xq.q, (const float *)xq.d, N, res, y);
        break;
    case GPU_Q4:
        if constexpr (NR > 1)
            launch(matmul_q4<NR>, g, b, 0, st, (const uint8_t *)w.data, w.scale4, w.group, w.rows,
               w.cols, (const int8_t *)xq.q, (const float *)xq.d, N, res, y);
        break;
    }
}

static thread_local bool use_mma = true;

void gpu_set_mma(bool on) { use_mma = on; }

void gpu_matmul(const GpuWeight &w, const float *x, const GpuQAct &xq, int64_t N, float *y,
                cudaStream_t st, const float *res) {
    if (N == 1 && (w.type == GPU_Q8 || w.type == GPU_Q4)) {
        if (w.type == GPU_Q8) launch_matvec_q<false>(w, xq, y, res, st);
        else launch_matvec_q<true>(w, xq, y, res, st);
    } else if (N == 1) {
        launch_matmul<1>(w, x, xq, N, y, res, st);
    } else if (use_mma && w.type == GPU_Q8) {
        launch_mma<false>(w, xq, N, y, res, st);
    } else if (use_mma && w.type == GPU_Q4) {
        launch_mma<true>(w, xq, N, y, res, st);
    } else {
        launch_matmul<NR_BATCH>(w, x, xq, N, y, res, st);
    }
}

/* One warp per 32-block: the CPU's quantize_q8_0_scalar (d = amax / 127, q = rint(x * 127 /
 * amax), round half to even, clamped to [-127, 127]). */
__global__ void quantize_q8_0(const float *__restrict__ x, int64_t n_blocks, int8_t *q, float *d) {
    pdl_sync();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (b >= n_blocks) return;
    quantize_block(x[b * 32 + (threadIdx.x & 31)], b, q, d);
}

void gpu_quantize(const float *x, int64_t N, int64_t C, GpuQAct xq, cudaStream_t st) {
    const int64_t n_blocks = N * C / 32;
    const int per = 8; /* 32-blocks per thread block */
    launch(quantize_q8_0, dim3((unsigned)((n_blocks + per - 1) / per)), dim3(per * 32), 0, st, x,
           n_blocks, xq.q, xq.d);
}

}  // namespace ats
