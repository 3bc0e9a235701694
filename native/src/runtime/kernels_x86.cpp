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
#define AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
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

/* Integer path on AVX2 (QAct activations): vpmaddubsw multiplies u8 x s8 pairwise into int16 and
 * vpmaddwd(., 1) sums those into int32 lanes. int4: codes 0..15 (u8) x activations; the -8 offset
 * comes from lane_neg8 (low and high nibble lanes of the 512-bit layout add up per 256-bit lane).
 * int8: |w| x sign(w) * x (llama.cpp's sign trick: both products fit int16 without saturation,
 * 2 * 127 * 127 < 32768). One 32-byte vector holds one block (int8) or one nibble plane of a
 * pair of blocks (int4). */
AVX2 static INLINE void q8_i8_avx2(int n, const int8_t *const *w, const float *scale,
                                   const QAct *const *x, float *out, const int NW, const int NX) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int nb = n / 32;
    __m256 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        /* QAct int8 lanes: block b's scale at lane_d[(b / 2) * 16 + (b % 2) * 8] */
        __m256i xv[4];
        __m256 xd[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) {
            xv[r] = _mm256_loadu_si256((const __m256i *)(x[r]->q + b * 32));
            xd[r] = _mm256_set1_ps(x[r]->d[b]);
        }
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(w[i] + b * 32));
            __m256i wa = _mm256_abs_epi8(wv);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) {
                __m256i p16 = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv[r], wv));
                __m256i dot = _mm256_madd_epi16(p16, ones);
                acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), xd[r], acc[i][r]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) out[i * 4 + r] = hsum256(acc[i][r]) * scale[i];
}

AVX2 static INLINE void q4_i8_avx2(int n, int group, const uint8_t *const *w,
                                   const float *const *scale, const QAct *const *x, float *out,
                                   const int NW, const int NX) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    const int nb = n / 32;
    __m256 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm256_setzero_ps();
    for (int p = 0; 2 * p < nb; p++) {
        bool two = 2 * p + 1 < nb;
        int g0 = 2 * p * 32 / group, g1 = two ? (2 * p + 1) * 32 / group : g0;
        __m256i xl[4], xh[4], xn[4];
        __m256 xd[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) {
            xl[r] = _mm256_loadu_si256((const __m256i *)(x[r]->q + p * 64));
            xh[r] = _mm256_loadu_si256((const __m256i *)(x[r]->q + p * 64 + 32));
            const int32_t *ng = x[r]->lane_neg8 + p * 16;
            xn[r] = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)ng),
                                     _mm256_loadu_si256((const __m256i *)(ng + 8)));
            xd[r] = _mm256_loadu_ps(x[r]->lane_d + p * 16); /* [d_2p x4, d_2p+1 x4] */
        }
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            /* an odd last block reads only its own 16 weight bytes */
            __m256i v = two ? _mm256_loadu_si256((const __m256i *)(w[i] + p * 32))
                            : _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w[i] + p * 32)));
            if (!two) v = _mm256_inserti128_si256(v, _mm_setzero_si128(), 1);
            __m256i lo = _mm256_and_si256(v, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            __m256 sc = _mm256_blend_ps(_mm256_set1_ps(scale[i][g0]), _mm256_set1_ps(scale[i][g1]),
                                        0xF0);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) {
                __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[r]),
                                               _mm256_maddubs_epi16(hi, xh[r]));
                __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(p16, ones), xn[r]);
                acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sc, xd[r]),
                                            acc[i][r]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) out[i * 4 + r] = hsum256(acc[i][r]);
}

/* Block shapes: 2x4, 4x1, 1x4, 1x1 as for the fp32-activation kernels. */
AVX2 static void dot_q8_i8_avx2(int n, const int8_t *const *w, const float *scale, int nw,
                                const QAct *const *x, int nx, float *out) {
    if (nw == 4 && nx == 4) {
        q8_i8_avx2(n, w, scale, x, out, 2, 4);
        q8_i8_avx2(n, w + 2, scale + 2, x, out + 8, 2, 4);
    } else if (nw == 4 && nx == 1) {
        q8_i8_avx2(n, w, scale, x, out, 4, 1);
    } else {
        for (int i = 0; i < nw; i++) {
            if (nx == 4) q8_i8_avx2(n, w + i, scale + i, x, out + i * 4, 1, 4);
            else for (int r = 0; r < nx; r++)
                q8_i8_avx2(n, w + i, scale + i, x + r, out + i * 4 + r, 1, 1);
        }
    }
}

AVX2 static void dot_q4_i8_avx2(int n, int group, const uint8_t *const *w,
                                const float *const *scale, int nw, const QAct *const *x, int nx,
                                float *out) {
    if (nw == 4 && nx == 4) {
        q4_i8_avx2(n, group, w, scale, x, out, 2, 4);
        q4_i8_avx2(n, group, w + 2, scale + 2, x, out + 8, 2, 4);
    } else if (nw == 4 && nx == 1) {
        q4_i8_avx2(n, group, w, scale, x, out, 4, 1);
    } else {
        for (int i = 0; i < nw; i++) {
            if (nx == 4) q4_i8_avx2(n, group, w + i, scale + i, x, out + i * 4, 1, 4);
            else for (int r = 0; r < nx; r++)
                q4_i8_avx2(n, group, w + i, scale + i, x + r, out + i * 4 + r, 1, 1);
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

/* ------------------------------------------------------------------ AVX-512 VNNI -------- */
/* Integer path on repacked weights (repack.h): vpdpbusd multiplies u8 x s8 in groups of 4 into
 * int32 lanes; one 64-byte step covers a pair of 32-blocks, its int32 lanes are converted once and
 * scaled by their block's activation scale d (and int4 weight scale).
 * int8 weights: the activation codes become unsigned by x + 128 (xor 0x80) and the extra
 * 128 * sum(w) is taken off with one more vpdpbusd per weight vector (shared by all activation
 * rows). int4 weights: the codes 0..15 are already unsigned; the -8 offset enters as the
 * accumulator's start value lane_neg8 = -8 * sum(x). Each (weight row, activation row) result is
 * the same op sequence whatever nx is, so a prefill row equals the same row decoded alone. */

AVX512VNNI static INLINE void q8_packed_vnni(int n_pairs, const uint8_t *w, const QAct *const *x,
                                             float *out, const int NX) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const float *scale = (const float *)w; /* row-group header: 4 row scales */
    const uint8_t *codes = w + 64;
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm512_setzero_ps();
    for (int p = 0; p < n_pairs; p++) {
        const uint8_t *rec = codes + p * 256;
        _mm_prefetch((const char *)(rec + 1024), _MM_HINT_T0);
        _mm_prefetch((const char *)(rec + 1088), _MM_HINT_T0);
        _mm_prefetch((const char *)(rec + 1152), _MM_HINT_T0);
        _mm_prefetch((const char *)(rec + 1216), _MM_HINT_T0);
        __m512i xu[4];
        __m512 xd[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) {
            xu[r] = _mm512_xor_si512(_mm512_loadu_si512(x[r]->q + p * 64), bias);
            xd[r] = _mm512_loadu_ps(x[r]->lane_d + p * 16);
        }
        #pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512i wv = _mm512_loadu_si512(rec + i * 64);
            __m512i wsum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, wv);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) {
                __m512i dot = _mm512_sub_epi32(
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), xu[r], wv), wsum);
                acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), xd[r], acc[i][r]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) out[i * 4 + r] = _mm512_reduce_add_ps(acc[i][r]) * scale[i];
}

/* Weight rows i0, i0 + 1 of an int4 row group against NX activation rows (2 x 4 keeps the
 * accumulators and activation registers within the 32 zmm registers). */
AVX512VNNI static INLINE void q4_packed_vnni(int n_pairs, const uint8_t *w, const QAct *const *x,
                                             float *out, const int I0, const int NW,
                                             const int NX) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    /* lanes 0-7 belong to block 2p, 8-15 to block 2p + 1 (natural QAct order); the record's
     * scales are (row i, block 2p + j) at 2i + j */
    __m512i pick[4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++) {
        const int a = 2 * (I0 + i), b = a + 1;
        pick[i] = _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
    }
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) acc[i][r] = _mm512_setzero_ps();
    for (int p = 0; p < n_pairs; p++) {
        const uint8_t *rec = w + p * 160;
        _mm_prefetch((const char *)(rec + 640), _MM_HINT_T0);
        _mm_prefetch((const char *)(rec + 704), _MM_HINT_T0);
        _mm_prefetch((const char *)(rec + 768), _MM_HINT_T0);
        __m512 scales = _mm512_castps256_ps512(_mm256_loadu_ps((const float *)(rec + 128)));
        __m512i xq[4], xn[4];
        __m512 xd[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) {
            xq[r] = _mm512_loadu_si512(x[r]->q + p * 64);
            xn[r] = _mm512_loadu_si512(x[r]->lane_neg8 + p * 16);
            xd[r] = _mm512_loadu_ps(x[r]->lane_d + p * 16);
        }
        #pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            /* 32 bytes -> [low nibbles = block 2p | high nibbles = block 2p + 1] (repack.h) */
            __m256i v = _mm256_loadu_si256((const __m256i *)(rec + (I0 + i) * 32));
            __m512i wv = _mm512_and_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), low4);
            __m512 sc = _mm512_permutexvar_ps(pick[i], scales);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) {
                __m512i dot = _mm512_dpbusd_epi32(xn[r], wv, xq[r]);
                acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sc, xd[r]),
                                            acc[i][r]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) out[(I0 + i) * 4 + r] = _mm512_reduce_add_ps(acc[i][r]);
}

/* quantize_q8_0 with the same fp32 operations as the scalar reference: vcvtps2dq rounds half to
 * even under the default MXCSR, like lrintf; codes are clamped before narrowing. */
AVX512 static void quantize_q8_0_avx512(int n_blocks, const float *x, int8_t *q, float *d) {
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int b = 0; b < n_blocks; b++) {
        __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        d[b] = amax / 127.0f;
        __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, inv));
        __m512i c1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, inv));
        c0 = _mm512_min_epi32(_mm512_max_epi32(c0, lo), hi);
        c1 = _mm512_min_epi32(_mm512_max_epi32(c1, lo), hi);
        _mm_storeu_si128((__m128i *)(q + b * 32), _mm512_cvtepi32_epi8(c0));
        _mm_storeu_si128((__m128i *)(q + b * 32 + 16), _mm512_cvtepi32_epi8(c1));
    }
}

AVX512VNNI static void dot_q8_packed_vnni(int n_pairs, const uint8_t *w, const QAct *const *x,
                                          int nx, float *out) {
    if (nx == 4) q8_packed_vnni(n_pairs, w, x, out, 4);
    else q8_packed_vnni(n_pairs, w, x, out, 1);
}

AVX512VNNI static void dot_q4_packed_vnni(int n_pairs, const uint8_t *w, const QAct *const *x,
                                          int nx, float *out) {
    if (nx == 4) {
        q4_packed_vnni(n_pairs, w, x, out, 0, 2, 4);
        q4_packed_vnni(n_pairs, w, x, out, 2, 2, 4);
    } else {
        q4_packed_vnni(n_pairs, w, x, out, 0, 4, 1);
    }
}

static const Kernels AVX2_SET = {"avx2",         dot_f32_avx2,   dot_q8_avx2, dot_q4_avx2,
                                 dot_q8_i8_avx2, dot_q4_i8_avx2, nullptr,     nullptr,
                                 axpy_avx2,      quantize_q8_0_scalar};
/* AVX-512 without VNNI: the AVX2 integer dots (AVX-512BW implies AVX2). */
static const Kernels AVX512_SET = {"avx512",       dot_f32_avx512, dot_q8_avx512,
                                   dot_q4_avx512,  dot_q8_i8_avx2, dot_q4_i8_avx2,
                                   nullptr,        nullptr,        axpy_avx512,
                                   quantize_q8_0_avx512};
/* Same name: VNNI only changes how the int8/int4 dots are done (on repacked weights; the AVX2
 * integer dots serve a weight that was not repacked). */
static const Kernels AVX512_VNNI_SET = {"avx512",           dot_f32_avx512,     dot_q8_avx512,
                                        dot_q4_avx512,      dot_q8_i8_avx2,     dot_q4_i8_avx2,
                                        dot_q8_packed_vnni, dot_q4_packed_vnni, axpy_avx512,
                                        quantize_q8_0_avx512};

const Kernels *kernels_avx2() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &AVX2_SET : nullptr;
}

const Kernels *kernels_avx512() {
    __builtin_cpu_init();
    bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    if (!ok) return nullptr;
    return __builtin_cpu_supports("avx512vnni") ? &AVX512_VNNI_SET : &AVX512_SET;
}

}  // namespace ats

#else

namespace ats {
const Kernels *kernels_avx2() { return nullptr; }
const Kernels *kernels_avx512() { return nullptr; }
}  // namespace ats

#endif
