/* x86 kernels: AVX2+FMA (8 floats) and AVX-512 (16 floats), each compiled for its ISA with
 * __attribute__((target)) and only called after CPUID says the CPU has it (kernels.cpp).
 * A block of NW weight rows x NX activation rows keeps NW*NX accumulators in registers; int8 and
 * int4 codes are widened, converted and scaled in registers (one dequantization per weight vector
 * serves all NX activation rows). Block shapes are compile-time constants of always-inline
 * helpers, so each shape gets fully unrolled code. */
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
/* GCC 12 warns falsely inside its own AVX-512 headers (_mm512_undefined_* idiom). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define INLINE inline __attribute__((always_inline))

namespace ats {

/* ------------------------------------------------------------------ AVX2 + FMA ---------- */

AVX2 static INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* 8 int8 codes -> fp32 weights * scale */
AVX2 static INLINE __m256 q8_to_f32_avx2(const int8_t *p, __m256 scale) {
    __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), scale);
}

/* 8 int4 codes (already masked to 0..15, low 8 bytes of c) -> (code - 8) * scale */
AVX2 static INLINE __m256 q4_to_f32_avx2(__m128i c, __m256 scale) {
    __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(c), _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), scale);
}

AVX2 static INLINE void f32_avx2(int n, const float *const *w, const float *const *x, float *out,
                                 const int NW, const int NX) {
    __m256 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 xv[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) xv[r] = _mm256_loadu_ps(x[r] + k);
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            __m256 wv = _mm256_loadu_ps(w[i] + k);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) acc[i][r] = _mm256_fmadd_ps(wv, xv[r], acc[i][r]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++) {
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) {
            float s = hsum256(acc[i][r]);
            for (int j = k; j < n; j++) s += w[i][j] * x[r][j];
            out[i * 4 + r] = s;
        }
    }
}

AVX2 static INLINE void q8_avx2(int n, const int8_t *const *w, const float *scale,
                                const float *const *x, float *out, const int NW, const int NX) {
    __m256 acc[4][4], sc[4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++) {
        sc[i] = _mm256_set1_ps(scale[i]);
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm256_setzero_ps();
    }
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 xv[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) xv[r] = _mm256_loadu_ps(x[r] + k);
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            __m256 wv = q8_to_f32_avx2(w[i] + k, sc[i]);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) acc[i][r] = _mm256_fmadd_ps(wv, xv[r], acc[i][r]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++) {
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) {
            float s = hsum256(acc[i][r]);
            for (int j = k; j < n; j++) s += ((float)w[i][j] * scale[i]) * x[r][j];
            out[i * 4 + r] = s;
        }
    }
}

AVX2 static INLINE void q4_avx2(int n, int group, const uint8_t *const *w,
                                const float *const *scale, const float *const *xe,
                                const float *const *xo, float *out, const int NW, const int NX) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const int half = group / 2;
    __m256 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm256_setzero_ps();
    for (int m = 0; m < n / 2; m += 16) { /* 16 bytes = 32 weights, inside one group */
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            __m256 s = _mm256_set1_ps(scale[i][m / half]);
            __m128i b = _mm_loadu_si128((const __m128i *)(w[i] + m));
            __m128i lo = _mm_and_si128(b, low4);
            __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
            __m256 l0 = q4_to_f32_avx2(lo, s), l1 = q4_to_f32_avx2(_mm_srli_si128(lo, 8), s);
            __m256 h0 = q4_to_f32_avx2(hi, s), h1 = q4_to_f32_avx2(_mm_srli_si128(hi, 8), s);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) {
                acc[i][r] = _mm256_fmadd_ps(l0, _mm256_loadu_ps(xe[r] + m), acc[i][r]);
                acc[i][r] = _mm256_fmadd_ps(l1, _mm256_loadu_ps(xe[r] + m + 8), acc[i][r]);
                acc[i][r] = _mm256_fmadd_ps(h0, _mm256_loadu_ps(xo[r] + m), acc[i][r]);
                acc[i][r] = _mm256_fmadd_ps(h1, _mm256_loadu_ps(xo[r] + m + 8), acc[i][r]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) out[i * 4 + r] = hsum256(acc[i][r]);
}

/* Block shapes: 2x4 (8 accumulators fit the 16 ymm registers), 4x1, 1x4, 1x1. */
AVX2 static void dot_f32_avx2(int n, const float *const *w, int nw, const float *const *x, int nx,
                              float *out) {
    if (nw == 4 && nx == 4) {
        f32_avx2(n, w, x, out, 2, 4);
        f32_avx2(n, w + 2, x, out + 8, 2, 4);
    } else if (nw == 4 && nx == 1) {
        f32_avx2(n, w, x, out, 4, 1);
    } else {
        for (int i = 0; i < nw; i++) {
            if (nx == 4) f32_avx2(n, w + i, x, out + i * 4, 1, 4);
            else for (int r = 0; r < nx; r++) f32_avx2(n, w + i, x + r, out + i * 4 + r, 1, 1);
        }
    }
}

AVX2 static void dot_q8_avx2(int n, const int8_t *const *w, const float *scale, int nw,
                             const float *const *x, int nx, float *out) {
    if (nw == 4 && nx == 4) {
        q8_avx2(n, w, scale, x, out, 2, 4);
        q8_avx2(n, w + 2, scale + 2, x, out + 8, 2, 4);
    } else if (nw == 4 && nx == 1) {
        q8_avx2(n, w, scale, x, out, 4, 1);
    } else {
        for (int i = 0; i < nw; i++) {
            if (nx == 4) q8_avx2(n, w + i, scale + i, x, out + i * 4, 1, 4);
            else for (int r = 0; r < nx; r++) q8_avx2(n, w + i, scale + i, x + r, out + i * 4 + r, 1, 1);
        }
    }
}

AVX2 static void dot_q4_avx2(int n, int group, const uint8_t *const *w, const float *const *scale,
                             int nw, const float *const *xe, const float *const *xo, int nx,
                             float *out) {
    if (nw == 4 && nx == 4) {
        q4_avx2(n, group, w, scale, xe, xo, out, 2, 4);
        q4_avx2(n, group, w + 2, scale + 2, xe, xo, out + 8, 2, 4);
    } else if (nw == 4 && nx == 1) {
        q4_avx2(n, group, w, scale, xe, xo, out, 4, 1);
    } else {
        for (int i = 0; i < nw; i++) {
            if (nx == 4) q4_avx2(n, group, w + i, scale + i, xe, xo, out + i * 4, 1, 4);
            else for (int r = 0; r < nx; r++)
                q4_avx2(n, group, w + i, scale + i, xe + r, xo + r, out + i * 4 + r, 1, 1);
        }
    }
}

AVX2 static void axpy_avx2(int n, float a, const float *x, float *y) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] += a * x[i];
}

/* ------------------------------------------------------------------ AVX-512 ------------- */

AVX512 static INLINE __mmask16 tail_mask(int left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

AVX512 static INLINE void f32_avx512(int n, const float *const *w, const float *const *x,
                                     float *out, const int NW, const int NX) {
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm512_setzero_ps();
    for (int k = 0; k < n; k += 16) {
        __mmask16 mk = tail_mask(n - k);
        __m512 xv[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) xv[r] = _mm512_maskz_loadu_ps(mk, x[r] + k);
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            __m512 wv = _mm512_maskz_loadu_ps(mk, w[i] + k);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) acc[i][r] = _mm512_fmadd_ps(wv, xv[r], acc[i][r]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) out[i * 4 + r] = _mm512_reduce_add_ps(acc[i][r]);
}

AVX512 static INLINE void q8_avx512(int n, const int8_t *const *w, const float *scale,
                                    const float *const *x, float *out, const int NW, const int NX) {
    __m512 acc[4][4], sc[4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++) {
        sc[i] = _mm512_set1_ps(scale[i]);
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm512_setzero_ps();
    }
    for (int k = 0; k < n; k += 16) {
        __mmask16 mk = tail_mask(n - k);
        __m512 xv[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) xv[r] = _mm512_maskz_loadu_ps(mk, x[r] + k);
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, w[i] + k));
            __m512 wv = _mm512_mul_ps(_mm512_cvtepi32_ps(q), sc[i]);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) acc[i][r] = _mm512_fmadd_ps(wv, xv[r], acc[i][r]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) out[i * 4 + r] = _mm512_reduce_add_ps(acc[i][r]);
}

AVX512 static INLINE void q4_avx512(int n, int group, const uint8_t *const *w,
                                    const float *const *scale, const float *const *xe,
                                    const float *const *xo, float *out, const int NW,
                                    const int NX) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m512i eight = _mm512_set1_epi32(8);
    const int half = group / 2;
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm512_setzero_ps();
    for (int m = 0; m < n / 2; m += 16) { /* 16 bytes = 32 weights, inside one group */
        __m512 ev[4], ov[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) {
            ev[r] = _mm512_loadu_ps(xe[r] + m);
            ov[r] = _mm512_loadu_ps(xo[r] + m);
        }
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            __m512 s = _mm512_set1_ps(scale[i][m / half]);
            __m128i b = _mm_loadu_si128((const __m128i *)(w[i] + m));
            __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(b, low4)), eight);
            __m512 lf = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), s);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) acc[i][r] = _mm512_fmadd_ps(lf, ev[r], acc[i][r]);
            __m512i hi = _mm512_sub_epi32(
                _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), low4)), eight);
            __m512 hf = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), s);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) acc[i][r] = _mm512_fmadd_ps(hf, ov[r], acc[i][r]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) out[i * 4 + r] = _mm512_reduce_add_ps(acc[i][r]);
}

/* Block shapes: 4x4 (16 accumulators of the 32 zmm registers), 4x1, 1x4, 1x1. */
AVX512 static void dot_f32_avx512(int n, const float *const *w, int nw, const float *const *x,
                                  int nx, float *out) {
    if (nw == 4 && nx == 4) f32_avx512(n, w, x, out, 4, 4);
    else if (nw == 4 && nx == 1) f32_avx512(n, w, x, out, 4, 1);
    else {
        for (int i = 0; i < nw; i++) {
            if (nx == 4) f32_avx512(n, w + i, x, out + i * 4, 1, 4);
            else for (int r = 0; r < nx; r++) f32_avx512(n, w + i, x + r, out + i * 4 + r, 1, 1);
        }
    }
}

AVX512 static void dot_q8_avx512(int n, const int8_t *const *w, const float *scale, int nw,
                                 const float *const *x, int nx, float *out) {
    if (nw == 4 && nx == 4) q8_avx512(n, w, scale, x, out, 4, 4);
    else if (nw == 4 && nx == 1) q8_avx512(n, w, scale, x, out, 4, 1);
    else {
        for (int i = 0; i < nw; i++) {
            if (nx == 4) q8_avx512(n, w + i, scale + i, x, out + i * 4, 1, 4);
            else for (int r = 0; r < nx; r++)
                q8_avx512(n, w + i, scale + i, x + r, out + i * 4 + r, 1, 1);
        }
    }
}

AVX512 static void dot_q4_avx512(int n, int group, const uint8_t *const *w,
                                 const float *const *scale, int nw, const float *const *xe,
                                 const float *const *xo, int nx, float *out) {
    if (nw == 4 && nx == 4) q4_avx512(n, group, w, scale, xe, xo, out, 4, 4);
    else if (nw == 4 && nx == 1) q4_avx512(n, group, w, scale, xe, xo, out, 4, 1);
    else {
        for (int i = 0; i < nw; i++) {
            if (nx == 4) q4_avx512(n, group, w + i, scale + i, xe, xo, out + i * 4, 1, 4);
            else for (int r = 0; r < nx; r++)
                q4_avx512(n, group, w + i, scale + i, xe + r, xo + r, out + i * 4 + r, 1, 1);
        }
    }
}

AVX512 static void axpy_avx512(int n, float a, const float *x, float *y) {
    __m512 av = _mm512_set1_ps(a);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 yv = _mm512_maskz_loadu_ps(m, y + i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), yv));
    }
}

static const Kernels AVX2_SET = {"avx2", dot_f32_avx2, dot_q8_avx2, dot_q4_avx2, axpy_avx2};
static const Kernels AVX512_SET = {"avx512", dot_f32_avx512, dot_q8_avx512, dot_q4_avx512,
                                   axpy_avx512};

const Kernels *kernels_avx2() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &AVX2_SET : nullptr;
}

const Kernels *kernels_avx512() {
    __builtin_cpu_init();
    bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    return ok ? &AVX512_SET : nullptr;
}

}  // namespace ats

#else

namespace ats {
const Kernels *kernels_avx2() { return nullptr; }
const Kernels *kernels_avx512() { return nullptr; }
}  // namespace ats

#endif
