/* Scalar reference kernels: the readable definition every SIMD path must match. */
#include "kernels.h"

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

static void axpy(int n, float a, const float *x, float *y) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static const Kernels SCALAR = {"scalar", dot_f32, dot_q8, dot_q4, axpy};

const Kernels *kernels_scalar() { return &SCALAR; }

}  // namespace ats
