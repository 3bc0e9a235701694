/* CPU dot-product kernels behind one dispatch table, chosen once by CPUID at first use:
 * AVX-512 (F+BW+VL), AVX2+FMA, NEON (aarch64), or the scalar reference. The x86 versions are
 * compiled with __attribute__((target)) so one binary runs on every CPU.
 *
 * Every kernel computes the nw x nx dot products of nw weight rows (1..4) with nx activation rows
 * (1..4): a register block that loads (and dequantizes) each weight vector once for 4 activation
 * rows and each activation vector once for 4 weight rows. int8/int4 codes are turned into the fp32
 * weights the reference dequantizer gives (q * scale, (c - 8) * scale) before the FMA, so results
 * equal an fp32 matmul with dequantized weights up to summation order. */
#pragma once
#include <stdint.h>

namespace ats {

struct Kernels {
    const char *name; /* "avx512", "avx2", "neon" or "scalar" */
    /* out[i * 4 + r] = sum_k w[i][k] * x[r][k], k < n, i < nw, r < nx */
    void (*dot_f32)(int n, const float *const *w, int nw, const float *const *x, int nx,
                    float *out);
    /* int8 rows: weight w[i][k] * scale[i] */
    void (*dot_q8)(int n, const int8_t *const *w, const float *scale, int nw,
                   const float *const *x, int nx, float *out);
    /* int4 rows of n weights in groups of `group` (32/64/128), two codes per byte (low nibble =
     * even element); weight (code - 8) * scale[i][g]. The activations come split into their even
     * elements xe[r] and odd elements xo[r] (n/2 each) so each nibble plane meets a contiguous
     * vector. */
    void (*dot_q4)(int n, int group, const uint8_t *const *w, const float *const *scale, int nw,
                   const float *const *xe, const float *const *xo, int nx, float *out);
    /* y[i] += a * x[i] */
    void (*axpy)(int n, float a, const float *x, float *y);
};

/* The kernel set for this CPU (chosen once, thread-safe). */
const Kernels *kernels_get();
/* The scalar reference set (tests compare the SIMD paths against it). */
const Kernels *kernels_scalar();

/* Per-ISA sets; NULL when not compiled in or not supported by this CPU. */
const Kernels *kernels_avx2();
const Kernels *kernels_avx512();
const Kernels *kernels_neon();

}  // namespace ats
