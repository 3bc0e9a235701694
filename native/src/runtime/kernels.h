/* CPU dot-product kernels behind one dispatch table, chosen once by CPUID at first use:
 * AVX-512 (F+BW+VL), AVX2+FMA, NEON (aarch64), or the scalar reference. The x86 versions are
 * compiled with __attribute__((target)) so one binary runs on every CPU.
 *
 * Every kernel computes the nw x nx dot products of nw weight rows (1..4) with nx activation rows
 * (1..4): a register block that loads (and dequantizes) each weight vector once for 4 activation
 * rows and each activation vector once for 4 weight rows.
 *  - dot_q8 / dot_q4 turn int8/int4 codes into the fp32 weights the reference dequantizer gives
 *    (q * scale, (c - 8) * scale) before the FMA: an fp32 matmul with dequantized weights up to
 *    summation order. matmul uses them where the integer path does not apply (rows that are not
 *    whole 32-blocks, or a set without integer kernels).
 *  - dot_q8_i8 / dot_q4_i8 take activations quantized to int8 per 32-block (QAct) and do the dots
 *    in integers (AVX2 vpmaddubsw + vpmaddwd, or the scalar reference), scaling once per block:
 *    llama.cpp's Q8_0 x Q8_0 / Q4_0 scheme, on the loaded weight layouts.
 *  - dot_q8_packed / dot_q4_packed (AVX-512 VNNI vpdpbusd) do the same on weights repacked at
 *    load (repack.h). */
#pragma once
#include <stdint.h>

#include <string>

namespace ats {

/* One activation row quantized for the integer path: blocks of 32 elements, each
 * q = round(x / d) in [-127, 127] with d = max|x| / 127 (llama.cpp's Q8_0 activations). The block
 * count is padded to even (zero blocks) so AVX-512 reads 64 codes = 2 blocks at a time.
 * Code order inside a pair of blocks b = 2p, 2p + 1 (64 bytes at q + 64p):
 *   natural (int8 weights, and int4 weights repacked by repack.h): block b at q + 32b;
 *   nibble-split (int4 weights as loaded): [even elements of b | even of b+1 | odd of b |
 *   odd of b+1], 16 each, matching the low / high nibble planes of the pair's 32 weight bytes.
 * The 16 int32 lanes of a 64-byte pair (4 codes each) get lane_d (the lane's block scale d) and,
 * for int4, lane_neg8 = -8 * (sum of the lane's 4 codes), which turns sum(code * x) into
 * sum((code - 8) * x). */
struct QAct {
    const int8_t *q;        /* n_pairs * 64 codes */
    const float *d;         /* n_pairs * 2 block scales */
    const float *lane_d;    /* n_pairs * 16 */
    const int32_t *lane_neg8; /* n_pairs * 16 (int4 layout only) */
};

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
    /* Integer-activation versions of dot_q8 / dot_q4 (n a multiple of 32): int8 weight codes x
     * int8 activation codes per 32-block, scaled once per block by d * weight scale. NULL when
     * the set has none (matmul then uses the fp32-activation kernels above). */
    void (*dot_q8_i8)(int n, const int8_t *const *w, const float *scale, int nw,
                      const QAct *const *x, int nx, float *out);
    void (*dot_q4_i8)(int n, int group, const uint8_t *const *w, const float *const *scale,
                      int nw, const QAct *const *x, int nx, float *out);
    /* The same integer dots on weights repacked at load (repack.h): 4 weight rows interleaved
     * per pair of 32-blocks, so one sequential stream feeds the kernel. w = one row group's
     * packed bytes, n_pairs pairs; nx = 1 or 4 QAct rows; out[i * 4 + r] for the 4 rows. NULL
     * when the set works on the loaded layout (the dot_*_i8 kernels above). */
    void (*dot_q8_packed)(int n_pairs, const uint8_t *w, const QAct *const *x, int nx,
                          float *out);
    void (*dot_q4_packed)(int n_pairs, const uint8_t *w, const QAct *const *x, int nx,
                          float *out);
    /* y[i] += a * x[i] */
    void (*axpy)(int n, float a, const float *x, float *y);
    /* n_blocks blocks of 32 activations x -> codes q (natural order) and block scales d (QAct) */
    void (*quantize_q8_0)(int n_blocks, const float *x, int8_t *q, float *d);
};

/* The scalar quantize_q8_0 (the reference; also the AVX2 and NEON sets'). */
void quantize_q8_0_scalar(int n_blocks, const float *x, int8_t *q, float *d);

/* The kernel set for this CPU (chosen once, thread-safe). */
const Kernels *kernels_get();
/* "auto" (or NULL: kernels_get) or a named set ("avx512", "avx2", "neon", "scalar"); NULL with
 * *err set when the name is unknown or the CPU lacks the set. */
const Kernels *kernels_by_name(const char *name, std::string *err);
/* The scalar reference set (tests compare the SIMD paths against it). */
const Kernels *kernels_scalar();

/* Per-ISA sets; NULL when not compiled in or not supported by this CPU. */
const Kernels *kernels_avx2();
const Kernels *kernels_avx512();
const Kernels *kernels_neon();

}  // namespace ats
