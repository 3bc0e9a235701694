/* Matrix-vector products for decode (and, chunk by chunk, prefill): one warp per output row,
 * each lane streaming 16-byte pieces of the weight row (coalesced across the warp) against up
 * to ROWS_PER_PASS activation rows held in registers, then a warp sum. Float weights (fp32,
 * bf16) dot fp32 activations; int8 / int4 weights dot Q8_0 activations in integers (dp4a), the
 * CPU runtime's scheme (kernels.h: dot_q8_packed, dot_q4_packed). */
#include "kernels.cuh"

namespace ats {

static const int WARPS = 4;          /* output rows per block */
static const int ROWS_PER_PASS = 8;  /* activation rows per block (blockIdx.y picks the chunk) */

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ void store_rows(const float *acc, int lane, int nr, int64_t n0,
                                           int64_t row, int64_t ldy, float *y) {
#pragma unroll
    for (int r = 0; r < ROWS_PER_PASS; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0 && r < nr) y[(n0 + r) * ldy + row] = s;
    }
}

/* fp32 weights: a lane takes 4 consecutive columns per step (cols % 4 == 0). */
__global__ void matmul_f32(const float *__restrict__ w, int64_t rows, int64_t cols,
                           const float *__restrict__ x, int64_t N, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int64_t n0 = (int64_t)blockIdx.y * ROWS_PER_PASS;
    if (row >= rows) return;
    const int nr = N - n0 < ROWS_PER_PASS ? (int)(N - n0) : ROWS_PER_PASS;
    float acc[ROWS_PER_PASS] = {};
    const float4 *wr = (const float4 *)(w + row * cols);
    for (int64_t k = lane; k < cols / 4; k += 32) {
        const float4 wv = __ldg(wr + k);
#pragma unroll
        for (int r = 0; r < ROWS_PER_PASS; r++) {
            if (r < nr) {
                const float4 xv = __ldg((const float4 *)(x + (n0 + r) * cols) + k);
                acc[r] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
            }
        }
    }
    store_rows(acc, lane, nr, n0, row, rows, y);
}

/* bf16 weights: a lane takes 8 consecutive columns (one 16-byte load) per step (cols % 8 == 0). */
__global__ void matmul_bf16(const __nv_bfloat16 *__restrict__ w, int64_t rows, int64_t cols,
                            const float *__restrict__ x, int64_t N, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int64_t n0 = (int64_t)blockIdx.y * ROWS_PER_PASS;
    if (row >= rows) return;
    const int nr = N - n0 < ROWS_PER_PASS ? (int)(N - n0) : ROWS_PER_PASS;
    float acc[ROWS_PER_PASS] = {};
    const uint4 *wr = (const uint4 *)(w + row * cols);
    for (int64_t k = lane; k < cols / 8; k += 32) {
        const uint4 raw = __ldg(wr + k);
        const __nv_bfloat162 *p = (const __nv_bfloat162 *)&raw;
        float wf[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __bfloat1622float2(p[i]);
            wf[2 * i] = f.x;
            wf[2 * i + 1] = f.y;
        }
#pragma unroll
        for (int r = 0; r < ROWS_PER_PASS; r++) {
            if (r < nr) {
                const float4 *xr = (const float4 *)(x + (n0 + r) * cols + k * 8);
                const float4 a = __ldg(xr), b = __ldg(xr + 1);
                acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                          wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
            }
        }
    }
    store_rows(acc, lane, nr, n0, row, rows, y);
}

/* int8 weights, Q8_0 activations: a lane takes whole 32-blocks; per block an exact integer dot,
 * acc = fma(dot, d_block, acc); the row scale once at the end (dot_q8_packed's order of
 * operations per block). */
__global__ void matmul_q8(const int8_t *__restrict__ w, const float *__restrict__ scale,
                          int64_t rows, int64_t cols, const int8_t *__restrict__ xq,
                          const float *__restrict__ xd, int64_t N, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int64_t n0 = (int64_t)blockIdx.y * ROWS_PER_PASS;
    if (row >= rows) return;
    const int nr = N - n0 < ROWS_PER_PASS ? (int)(N - n0) : ROWS_PER_PASS;
    const int64_t nb = cols / 32;
    float acc[ROWS_PER_PASS] = {};
    const int4 *wr = (const int4 *)(w + row * cols);
    for (int64_t b = lane; b < nb; b += 32) {
        const int4 w0 = __ldg(wr + 2 * b), w1 = __ldg(wr + 2 * b + 1);
#pragma unroll
        for (int r = 0; r < ROWS_PER_PASS; r++) {
            if (r < nr) {
                const int4 *xr = (const int4 *)(xq + (n0 + r) * cols) + 2 * b;
                const int4 x0 = __ldg(xr), x1 = __ldg(xr + 1);
                int dot = __dp4a(w0.x, x0.x, 0);
                dot = __dp4a(w0.y, x0.y, dot);
                dot = __dp4a(w0.z, x0.z, dot);
                dot = __dp4a(w0.w, x0.w, dot);
                dot = __dp4a(w1.x, x1.x, dot);
                dot = __dp4a(w1.y, x1.y, dot);
                dot = __dp4a(w1.z, x1.z, dot);
                dot = __dp4a(w1.w, x1.w, dot);
                acc[r] = fmaf((float)dot, __ldg(xd + (n0 + r) * nb + b), acc[r]);
            }
        }
    }
    const float s = __ldg(scale + row);
#pragma unroll
    for (int r = 0; r < ROWS_PER_PASS; r++) acc[r] *= s;
    store_rows(acc, lane, nr, n0, row, rows, y);
}

/* int4 weights (16 bytes per 32-block: low nibbles elements 0..15, high 16..31), Q8_0
 * activations: dot = sum(c * q) - 8 * sum(q) exactly, acc = fma(dot, scale_fp16 * d, acc)
 * (dot_q4_packed's order of operations per block). */
__global__ void matmul_q4(const uint8_t *__restrict__ w, const __half *__restrict__ scale,
                          int group, int64_t rows, int64_t cols, const int8_t *__restrict__ xq,
                          const float *__restrict__ xd, int64_t N, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int64_t n0 = (int64_t)blockIdx.y * ROWS_PER_PASS;
    if (row >= rows) return;
    const int nr = N - n0 < ROWS_PER_PASS ? (int)(N - n0) : ROWS_PER_PASS;
    const int64_t nb = cols / 32, per_group = group / 32, ng = cols / group;
    float acc[ROWS_PER_PASS] = {};
    const int4 *wr = (const int4 *)(w + row * nb * 16);
    for (int64_t b = lane; b < nb; b += 32) {
        const int4 c = __ldg(wr + b);
        const int cw[4] = {c.x, c.y, c.z, c.w};
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = cw[i] & 0x0F0F0F0F;
            hi[i] = (cw[i] >> 4) & 0x0F0F0F0F;
        }
        const float ws = __half2float(__ldg(scale + row * ng + b / per_group));
#pragma unroll
        for (int r = 0; r < ROWS_PER_PASS; r++) {
            if (r < nr) {
                const int4 *xr = (const int4 *)(xq + (n0 + r) * cols) + 2 * b;
                const int4 x0 = __ldg(xr), x1 = __ldg(xr + 1); /* elements 0..15, 16..31 */
                int dot = __dp4a(lo[0], x0.x, 0);
                dot = __dp4a(lo[1], x0.y, dot);
                dot = __dp4a(lo[2], x0.z, dot);
                dot = __dp4a(lo[3], x0.w, dot);
                dot = __dp4a(hi[0], x1.x, dot);
                dot = __dp4a(hi[1], x1.y, dot);
                dot = __dp4a(hi[2], x1.z, dot);
                dot = __dp4a(hi[3], x1.w, dot);
                int sum = __dp4a(0x01010101, x0.x, 0);
                sum = __dp4a(0x01010101, x0.y, sum);
                sum = __dp4a(0x01010101, x0.z, sum);
                sum = __dp4a(0x01010101, x0.w, sum);
                sum = __dp4a(0x01010101, x1.x, sum);
                sum = __dp4a(0x01010101, x1.y, sum);
                sum = __dp4a(0x01010101, x1.z, sum);
                sum = __dp4a(0x01010101, x1.w, sum);
                dot -= 8 * sum;
                acc[r] = fmaf((float)dot, ws * __ldg(xd + (n0 + r) * nb + b), acc[r]);
            }
        }
    }
    store_rows(acc, lane, nr, n0, row, rows, y);
}

void gpu_matmul(const GpuWeight &w, const float *x, const GpuQAct &xq, int64_t N, float *y,
                cudaStream_t st) {
    const dim3 grid((unsigned)((w.rows + WARPS - 1) / WARPS),
                    (unsigned)((N + ROWS_PER_PASS - 1) / ROWS_PER_PASS));
    const int threads = WARPS * 32;
    switch (w.type) {
    case GPU_F32:
        matmul_f32<<<grid, threads, 0, st>>>((const float *)w.data, w.rows, w.cols, x, N, y);
        break;
    case GPU_BF16:
        matmul_bf16<<<grid, threads, 0, st>>>((const __nv_bfloat16 *)w.data, w.rows, w.cols, x,
                                              N, y);
        break;
    case GPU_Q8:
        matmul_q8<<<grid, threads, 0, st>>>((const int8_t *)w.data, w.scale, w.rows, w.cols,
                                            xq.q, xq.d, N, y);
        break;
    case GPU_Q4:
        matmul_q4<<<grid, threads, 0, st>>>((const uint8_t *)w.data, w.scale4, w.group, w.rows,
                                            w.cols, xq.q, xq.d, N, y);
        break;
    }
}

/* One warp per 32-block: the CPU's quantize_q8_0_scalar (d = amax / 127, q = rint(x * 127 /
 * amax), round half to even, clamped to [-127, 127]). */
__global__ void quantize_q8_0(const float *__restrict__ x, int64_t n_blocks, int8_t *q, float *d) {
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    const float v = x[b * 32 + lane];
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int c = __float2int_rn(__fmul_rn(v, inv));
    q[b * 32 + lane] = (int8_t)(c < -127 ? -127 : c > 127 ? 127 : c);
    if (lane == 0) d[b] = amax / 127.0f;
}

void gpu_quantize(const float *x, int64_t N, int64_t C, GpuQAct xq, cudaStream_t st) {
    const int64_t n_blocks = N * C / 32;
    const int per = 8; /* 32-blocks per thread block */
    quantize_q8_0<<<(unsigned)((n_blocks + per - 1) / per), per * 32, 0, st>>>(x, n_blocks, xq.q,
                                                                              xq.d);
}

}  // namespace ats
