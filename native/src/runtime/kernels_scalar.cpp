/* Scalar reference kernels: the readable definition every SIMD path must match. */
#include "kernels.h"

#include <math.h>
#include <string.h>

namespace ats {

/* an fp32 value, or an IEEE half one converted exactly */
static inline float to_f32(float v) { return v; }
static inline float to_f32(uint16_t h) { return f32_from_fp16(h); }

template <typename W>
static void dot(int n, const W *const *w, int nw, const float *const *x, int nx, float *out) {
    for (int i = 0; i < nw; i++) {
        for (int r = 0; r < nx; r++) {
            float acc = 0.0f;
            for (int k = 0; k < n; k++) acc += to_f32(w[i][k]) * x[r][k];
            out[i * 4 + r] = acc;
        }
    }
}

static void dot_f32(int n, const float *const *w, int nw, const float *const *x, int nx,
                    float *out) {
    dot(n, w, nw, x, nx, out);
}

void dot_f16_scalar(int n, const uint16_t *const *w, int nw, const float *const *x, int nx,
                    float *out) {
    dot(n, w, nw, x, nx, out);
}

static void dot_q8(int n, const int8_t *const *w, const float *scale, int nw,
                   const float *const *x, int nx, float *out) {
    for (int i = 0; i < nw; i++) {
        for (int r = 0; r < nx; r++) {
            float acc = 0.0f;
            for (int k = 0; k < n; k++) acc += ((float)w[i][k] * scale[i]) * x[r][k];
            out[i * 4 + r] = acc;
        }
    }
}

static void dot_q4(int n, int group, const uint8_t *const *w, const float *const *scale, int nw,
                   const float *const *xe, const float *const *xo, int nx, float *out) {
    int half = group / 2;
    for (int i = 0; i < nw; i++) {
        for (int r = 0; r < nx; r++) {
            float acc = 0.0f;
            for (int m = 0; m < n / 2; m++) {
                float s = scale[i][m / half];
                acc += ((float)((int)(w[i][m] & 0x0F) - 8) * s) * xe[r][m];
                acc += ((float)((int)(w[i][m] >> 4) - 8) * s) * xo[r][m];
            }
            out[i * 4 + r] = acc;
        }
    }
}

/* Integer path on the packed layouts (repack.h): per 32-block an exact integer dot of codes,
 * scaled by d_block (and the fp16 int4 weight scale) and added with one fused multiply-add, the
 * operation the SIMD sets' vfmadd does: every set gives bit-identical results (test_matmul.py). */
static void dot_q8_packed(int n_blocks, const uint8_t *w, const QAct *const *x, int nx,
                          float *out, int64_t ldo) {
    const float *row_scale = (const float *)w; /* row-group header */
    const uint8_t *codes = w + PACK_ROWS * 4;
    for (int L = 0; L < PACK_ROWS; L++) {
        for (int r = 0; r < nx; r++) {
            float acc = 0.0f;
            for (int b = 0; b < n_blocks; b++) {
                const uint8_t *rec = codes + b * 512;
                int32_t dot = 0;
                for (int e = 0; e < 32; e++) { /* element e: vector e / 4, lane L, byte e % 4 */
                    int32_t wq = (int32_t)rec[64 * (e / 4) + 4 * L + e % 4] - 128;
                    dot += wq * x[r]->q[b * 32 + e];
                }
                acc = fmaf((float)dot, x[r]->d[b], acc);
            }
            out[r * ldo + L] = acc * row_scale[L];
        }
    }
}

static void dot_q4_packed(int n_blocks, const uint8_t *w, const QAct *const *x, int nx,
                          float *out, int64_t ldo) {
    for (int L = 0; L < PACK_ROWS; L++) {
        for (int r = 0; r < nx; r++) {
            float acc = 0.0f;
            for (int b = 0; b < n_blocks; b++) {
                const uint8_t *rec = w + b * 288;
                int32_t dot = 0;
                for (int e = 0; e < 16; e++) { /* byte: element e (low), element 16 + e (high) */
                    uint8_t c = rec[64 * (e / 4) + 4 * L + e % 4];
                    dot += ((int32_t)(c & 0x0F) - 8) * x[r]->q[b * 32 + e];
                    dot += ((int32_t)(c >> 4) - 8) * x[r]->q[b * 32 + 16 + e];
                }
                uint16_t h;
                memcpy(&h, rec + 256 + 2 * L, 2);
                acc = fmaf((float)dot, f32_from_fp16(h) * x[r]->d[b], acc);
            }
            out[r * ldo + L] = acc;
        }
    }
}

uint16_t fp16_from_f32(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t a = x & 0x7FFFFFFF;
    if (a > 0x7F800000) return sign | 0x7E00;  /* NaN */
    if (a >= 0x47800000) return sign | 0x7C00; /* >= 65536 (or inf): inf */
    if (a < 0x38800000) {                      /* below 2^-14: a half subnormal m * 2^-24 */
        float m = nearbyintf(fabsf(f) * 16777216.0f); /* exact scaling, round half to even */
        return sign | (uint16_t)m; /* m = 1024 is the smallest normal's encoding */
    }
    uint32_t h = (a >> 13) - ((127 - 15) << 10); /* rebias the exponent, keep 10 mantissa bits */
    const uint32_t rest = a & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry may reach inf: correct */
    return sign | (uint16_t)h;
}

float f32_from_fp16(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* subnormal: m * 2^-24 */
        return sign ? -v : v;
    }
    uint32_t bits = sign | (e == 31 ? 0x7F800000 | m << 13 : (e + 112) << 23 | m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void quantize_q8_0_scalar(int n_blocks, const float *x, int8_t *q, float *d) {
    for (int b = 0; b < n_blocks; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
        d[b] = amax / 127.0f;
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 32; j++) {
            long v = lrintf(xb[j] * inv); /* round half to even (default rounding mode) */
            q[b * 32 + j] = (int8_t)(v < -127 ? -127 : v > 127 ? 127 : v);
        }
    }
}

void silu_mul_scalar(int n, float *g, const float *u) {
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

template <typename X>
static void vecmat(int n, int m, const float *const *a, int R, const X *x, int64_t ld,
                   float *const *y) {
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < n; i++) {
            float acc = 0.0f;
            for (int j = 0; j < m; j++) acc = fmaf(a[r][j], to_f32(x[j * ld + i]), acc);
            y[r][i] = acc;
        }
    }
}

void vecmat_scalar(int n, int m, const float *const *a, int R, const float *x, int64_t ld,
                   float *const *y) {
    vecmat(n, m, a, R, x, ld, y);
}

void vecmat_f16_scalar(int n, int m, const float *const *a, int R, const uint16_t *x, int64_t ld,
                       float *const *y) {
    vecmat(n, m, a, R, x, ld, y);
}

void softmax_scalar(int n, float scale, float *x) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        x[i] *= scale;
        mx = fmaxf(mx, x[i]);
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void transpose_scalar(int n, int m, const float *const *x, float *y, int64_t ldy) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) y[j * ldy + i] = x[i][j];
    }
}

void f16_to_f32_scalar(int n, const uint16_t *x, float *y) {
    for (int i = 0; i < n; i++) y[i] = f32_from_fp16(x[i]);
}

void f32_to_f16_scalar(int n, const float *x, uint16_t *y) {
    for (int i = 0; i < n; i++) y[i] = fp16_from_f32(x[i]);
}

static const Kernels SCALAR = {"scalar",      dot_f32,       dot_f16_scalar, dot_q8,
                               dot_q4,        dot_q8_packed, dot_q4_packed,
                               vecmat_scalar, vecmat_f16_scalar, softmax_scalar,
                               quantize_q8_0_scalar,         silu_mul_scalar,
                               transpose_scalar,             f16_to_f32_scalar,
                               f32_to_f16_scalar};

const Kernels *kernels_scalar() { return &SCALAR; }

}  // namespace ats
