/* Scalar reference kernels: the readable definition every SIMD path must match. */
#include "kernels.h"

#include <math.h>

namespace ats {

static void dot_f32(int n, const float *const *w, int nw, const float *const *x, int nx,
                    float *out) {
    for (int i = 0; i < nw; i++) {
        for (int r = 0; r < nx; r++) {
            float acc = 0.0f;
            for (int k = 0; k < n; k++) acc += w[i][k] * x[r][k];
            out[i * 4 + r] = acc;
        }
    }
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

/* Integer path: per 32-block an exact integer dot of codes, scaled by d_block * weight scale. */
static void dot_q8_i8(int n, const int8_t *const *w, const float *scale, int nw,
                      const QAct *const *x, int nx, float *out) {
    for (int i = 0; i < nw; i++) {
        for (int r = 0; r < nx; r++) {
            float acc = 0.0f;
            for (int b = 0; b < n / 32; b++) {
                int32_t dot = 0;
                for (int j = 0; j < 32; j++) dot += (int32_t)w[i][b * 32 + j] * x[r]->q[b * 32 + j];
                acc += (float)dot * x[r]->d[b];
            }
            out[i * 4 + r] = acc * scale[i];
        }
    }
}

static void dot_q4_i8(int n, int group, const uint8_t *const *w, const float *const *scale,
                      int nw, const QAct *const *x, int nx, float *out) {
    for (int i = 0; i < nw; i++) {
        for (int r = 0; r < nx; r++) {
            float acc = 0.0f;
            for (int b = 0; b < n / 32; b++) {
                /* QAct int4 order: even codes of b at pair + 16h, odd codes at pair + 32 + 16h */
                const int8_t *xe = x[r]->q + (b / 2) * 64 + (b % 2) * 16, *xo = xe + 32;
                const uint8_t *wb = w[i] + b * 16;
                int32_t dot = 0;
                for (int j = 0; j < 16; j++) {
                    dot += ((int32_t)(wb[j] & 0x0F) - 8) * xe[j];
                    dot += ((int32_t)(wb[j] >> 4) - 8) * xo[j];
                }
                acc += (float)dot * (x[r]->d[b] * scale[i][b * 32 / group]);
            }
            out[i * 4 + r] = acc;
        }
    }
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

static void axpy(int n, float a, const float *x, float *y) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static const Kernels SCALAR = {"scalar", dot_f32, dot_q8, dot_q4, dot_q8_i8, dot_q4_i8,
                                 nullptr, nullptr,
                                 axpy, quantize_q8_0_scalar};

const Kernels *kernels_scalar() { return &SCALAR; }

}  // namespace ats
