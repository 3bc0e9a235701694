/* CPU dot-product kernels behind one dispatch table, chosen once by CPUID at first use:
 * AVX-512 (F+BW+VL), AVX2+FMA, NEON (aarch64), or the scalar reference. The x86 versions are
 * compiled with __attribute__((target)) so one binary runs on every CPU.
 *
 * The fp32-activation kernels compute the nw x nx dot products of nw weight rows (1..4) with nx activation rows
 * (1..4): a register block that loads (and dequantizes) each weight vector once for 4 activation
 * rows and each activation vector once for 4 weight rows.
 *  - dot_q8 / dot_q4 turn int8/int4 codes into the fp32 weights the reference dequantizer gives
 *    (q * scale, (c - 8) * scale) before the FMA: an fp32 matmul with dequantized weights up to
 *    summation order. matmul uses them where the integer path does not apply (rows that are not
 *    whole 32-blocks, or a set without integer kernels).
 *  - dot_q8_packed / dot_q4_packed take activations quantized to int8 per 32-block (QAct) and
 *    do the dots in integers on weights repacked at load (repack.h: 16 rows per row group, one
 *    output row per 32-bit vector lane), scaling once per block: llama.cpp's Q8_0 x Q8_0 / Q4_0
 *    scheme. AVX-512 VNNI (vpdpbusd), AVX2 (vpmaddubsw + vpmaddwd) and the scalar reference all
 *    stream the same packed layout. */
#pragma once
#include <stdint.h>

#include <string>

namespace ats {

/* One activation row quantized for the integer path: blocks of 32 elements in natural order,
 * each q = round(x / d) in [-127, 127] with d = max|x| / 127 (llama.cpp's Q8_0 activations), and
 * the sum of each block's codes: the packed kernels multiply unsigned weight codes u = w + 128
 * (int8) or u = c (int4, weight c - 8) with q, so sum(w * q) = sum(u * q) - 128 * sum(q)
 * (int8) and sum((c - 8) * q) = sum(c * q) - 8 * sum(q) (int4). The int4 start values
 * -8 * sum(q) are stored too, so the int4 kernels broadcast them straight from memory. */
struct QAct {
    const int8_t *q;       /* n_blocks * 32 codes */
    const float *d;        /* n_blocks block scales */
    const int32_t *sum;    /* n_blocks sums of the block's codes */
    const int32_t *start4; /* n_blocks values -8 * sum[b] */
};

/* Weight rows per row group of the packed layouts (repack.h): one per 32-bit lane of a 512-bit
 * vector. */
static const int PACK_ROWS = 16;
/* Activation rows one packed-kernel call takes at most (register budget of the VNNI kernels). */
static const int PACK_MAX_NX = 8;
/* Row vectors one vecmat call takes at most (register budget of the AVX-512 version). */
static const int VECMAT_MAX_ROWS = 4;

struct Kernels {
    const char *name; /* "avx512", "avx2", "neon" or "scalar" */
    /* out[i * 4 + r] = sum_k w[i][k] * x[r][k], k < n, i < nw, r < nx */
    void (*dot_f32)(int n, const float *const *w, int nw, const float *const *x, int nx,
                    float *out);
    /* dot_f32 with the w rows in IEEE half precision (an f16 KV cache's keys), each converted
     * exactly to fp32 before the same multiply-adds: equal to dot_f32 on the converted rows */
    void (*dot_f16)(int n, const uint16_t *const *w, int nw, const float *const *x, int nx,
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
    /* Integer dots on weights repacked at load (repack.h): one row group (PACK_ROWS weight rows,
     * n_blocks 32-blocks each) against nx QAct rows, 1 <= nx <= PACK_MAX_NX, into
     * out[r * ldo + i] (weight row i of the group, activation row r; ldo >= PACK_ROWS, so the
     * results land in the output matrix itself):
     *   int8: (sum_b dot_b * d_b) * row_scale_i
     *   int4: sum_b dot_b * (scale_ib * d_b), scale_ib the fp16 scale of the packed copy
     * with dot_b the exact integer dot of block b. NULL when the set has no integer kernels
     * (matmul then uses the fp32-activation kernels above on the loaded layout). */
    void (*dot_q8_packed)(int n_blocks, const uint8_t *w, const QAct *const *x, int nx,
                          float *out, int64_t ldo);
    void (*dot_q4_packed)(int n_blocks, const uint8_t *w, const QAct *const *x, int nx,
                          float *out, int64_t ldo);
    /* y[r][i] = sum_j a[r][j] * x[j * ld + i] for i < n, j = 0..m-1 in order, r < R (any m >= 0,
     * R = 1..VECMAT_MAX_ROWS row vectors times one row-major (m, n) matrix of row stride ld):
     * attention's scores against keys transposed to (head_dim, keys) and its sum of values
     * (keys, head_dim) weighted by the probabilities, without horizontal sums; each x vector
     * loaded serves all R rows, and a row's result does not depend on R */
    void (*vecmat)(int n, int m, const float *const *a, int R, const float *x, int64_t ld,
                   float *const *y);
    /* vecmat with x in IEEE half precision (an f16 KV cache's values), converted exactly:
     * equal to vecmat on the converted matrix */
    void (*vecmat_f16)(int n, int m, const float *const *a, int R, const uint16_t *x, int64_t ld,
                       float *const *y);
    /* x[i] = softmax(scale * x)[i], i < n >= 1 (attention's probabilities from raw scores: the
     * SIMD sets use the silu_mul exp polynomial and fp32 lane sums, the scalar set expf and a
     * double sum) */
    void (*softmax)(int n, float scale, float *x);
    /* n_blocks blocks of 32 activations x -> codes q (natural order) and block scales d (QAct) */
    void (*quantize_q8_0)(int n_blocks, const float *x, int8_t *q, float *d);
    /* g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i] (SwiGLU's gate; the SIMD sets
     * evaluate exp with a degree-6 polynomial, within a few ulp of expf) */
    void (*silu_mul)(int n, float *g, const float *u);
    /* y[j * ldy + i] = x[i][j] for i < n, j < m (n rows given by pointers, each m long, into
     * the columns of y): attention's keys into their (head_dim, keys) layout. Copies only, so
     * every set gives the same y */
    void (*transpose)(int n, int m, const float *const *x, float *y, int64_t ldy);
    /* y[i] = x[i] for i < n, IEEE half -> single (exact): the f16 KV cache read back */
    void (*f16_to_f32)(int n, const uint16_t *x, float *y);
    /* y[i] = x[i] rounded to half precision, nearest even (|x| >= 65520 -> inf; what F16C's
     * vcvtps2ph does): the f16 KV cache's writes. Every set gives the same bits but for NaN
     * payloads */
    void (*f32_to_f16)(int n, const float *x, uint16_t *y);
};

/* The scalar quantize_q8_0 (the reference; also the AVX2 and NEON sets'). */
void quantize_q8_0_scalar(int n_blocks, const float *x, int8_t *q, float *d);

/* The scalar vecmat (the reference; also the NEON set's). */
void vecmat_scalar(int n, int m, const float *const *a, int R, const float *x, int64_t ld,
                   float *const *y);

/* The scalar dot_f16 and vecmat_f16 (the references; also the NEON set's). */
void dot_f16_scalar(int n, const uint16_t *const *w, int nw, const float *const *x, int nx,
                    float *out);
void vecmat_f16_scalar(int n, int m, const float *const *a, int R, const uint16_t *x, int64_t ld,
                       float *const *y);

/* The scalar softmax (the reference; also the NEON set's). */
void softmax_scalar(int n, float scale, float *x);

/* The scalar transpose (the reference; also the AVX2 and NEON sets'). */
void transpose_scalar(int n, int m, const float *const *x, float *y, int64_t ldy);

/* The scalar silu_mul (expf; also the NEON set's). */
void silu_mul_scalar(int n, float *g, const float *u);

/* The scalar f16 <-> f32 conversions (the reference; also the NEON set's). */
void f16_to_f32_scalar(int n, const uint16_t *x, float *y);
void f32_to_f16_scalar(int n, const float *x, uint16_t *y);

/* IEEE half precision <-> fp32, round to nearest even (what F16C's vcvtps2ph and numpy's
 * astype(float16) do); the packed int4 scales are stored as fp16. */
uint16_t fp16_from_f32(float f);
float f32_from_fp16(uint16_t h);

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
