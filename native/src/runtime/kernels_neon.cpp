/* NEON kernels (aarch64): 4-wide fp32 FMA, one weight row x one activation row at a time; int8 and
 * int4 codes widened and scaled in registers. Compiled only on aarch64 (NEON is base ISA there). */
#include "kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

namespace ats {

static float dot1_f32(int n, const float *w, const float *x) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int k = 0;
    for (; k + 4 <= n; k += 4) acc = vfmaq_f32(acc, vld1q_f32(w + k), vld1q_f32(x + k));
    float s = vaddvq_f32(acc);
    for (; k < n; k++) s += w[k] * x[k];
    return s;
}

static void dot_f32_neon(int n, const float *const *w, int nw, const float *const *x, int nx,
                         float *out) {
    for (int i = 0; i < nw; i++)
        for (int r = 0; r < nx; r++) out[i * 4 + r] = dot1_f32(n, w[i], x[r]);
}

static float dot1_q8(int n, const int8_t *w, float scale, const float *x) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        int16x8_t w16 = vmovl_s8(vld1_s8(w + k));
        float32x4_t w0 = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w16))), scale);
        float32x4_t w1 = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w16))), scale);
        acc = vfmaq_f32(acc, w0, vld1q_f32(x + k));
        acc = vfmaq_f32(acc, w1, vld1q_f32(x + k + 4));
    }
    float s = vaddvq_f32(acc);
    for (; k < n; k++) s += ((float)w[k] * scale) * x[k];
    return s;
}

static void dot_q8_neon(int n, const int8_t *const *w, const float *scale, int nw,
                        const float *const *x, int nx, float *out) {
    for (int i = 0; i < nw; i++)
        for (int r = 0; r < nx; r++) out[i * 4 + r] = dot1_q8(n, w[i], scale[i], x[r]);
}

/* 8 codes -> (code - 8) * scale, dotted with 8 activations */
static float32x4_t nibbles_dot(uint8x8_t codes, float scale, const float *xv, float32x4_t acc) {
    int16x8_t c = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(codes)), vdupq_n_s16(8));
    float32x4_t w0 = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(c))), scale);
    float32x4_t w1 = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(c))), scale);
    acc = vfmaq_f32(acc, w0, vld1q_f32(xv));
    return vfmaq_f32(acc, w1, vld1q_f32(xv + 4));
}

static void dot_q4_neon(int n, int group, const uint8_t *const *w, const float *const *scale,
                        int nw, const float *const *xe, const float *const *xo, int nx,
                        float *out) {
    int half = group / 2;
    for (int i = 0; i < nw; i++) {
        for (int r = 0; r < nx; r++) {
            float32x4_t acc = vdupq_n_f32(0.0f);
            for (int m = 0; m < n / 2; m += 8) {
                uint8x8_t b = vld1_u8(w[i] + m);
                float s = scale[i][m / half];
                acc = nibbles_dot(vand_u8(b, vdup_n_u8(0x0F)), s, xe[r] + m, acc);
                acc = nibbles_dot(vshr_n_u8(b, 4), s, xo[r] + m, acc);
            }
            out[i * 4 + r] = vaddvq_f32(acc);
        }
    }
}

static const Kernels NEON_SET = {"neon",        dot_f32_neon,   dot_f16_scalar, dot_q8_neon,
                                 dot_q4_neon,   nullptr,        nullptr,
                                 vecmat_scalar, vecmat_f16_scalar, softmax_scalar,
                                 quantize_q8_0_scalar,          silu_mul_scalar,
                                 transpose_scalar,              f16_to_f32_scalar,
                                 f32_to_f16_scalar};

const Kernels *kernels_neon() { return &NEON_SET; }

}  // namespace ats

#else

namespace ats {
const Kernels *kernels_neon() { return nullptr; }
}  // namespace ats

#endif
