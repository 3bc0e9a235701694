/* AVX2 + FMA kernels (8 floats per vector); the layout of every kernel family: kernels_x86.h. */
#include "kernels_x86.h"

#if defined(__x86_64__) || defined(__i386__)

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

/* 8 fp32 values, or 8 IEEE half ones converted exactly (F16C) */
AVX2 static INLINE __m256 load8(const float *p) { return _mm256_loadu_ps(p); }
AVX2 static INLINE __m256 load8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline float to_f32(float v) { return v; }
static inline float to_f32(uint16_t h) { return f32_from_fp16(h); }

template <typename W>
AVX2 static INLINE void f32_avx2(int n, const W *const *w, const float *const *x, float *out,
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
            __m256 wv = load8(w[i] + k);
            #pragma GCC unroll 4
            for (int r = 0; r < NX; r++) acc[i][r] = _mm256_fmadd_ps(wv, xv[r], acc[i][r]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NW; i++) {
        #pragma GCC unroll 4
        for (int r = 0; r < NX; r++) {
            float s = hsum256(acc[i][r]);
            for (int j = k; j < n; j++) s += to_f32(w[i][j]) * x[r][j];
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

/* Block shapes: 2x4 (8 accumulators fit the 16 ymm registers), 4x1, 4x2 (attention: 4 keys x
 * 2 query heads of a GQA group), 1x4, 1x1. */
template <typename W>
AVX2 static void dot_avx2(int n, const W *const *w, int nw, const float *const *x, int nx,
                          float *out) {
    if (nw == 4 && nx == 4) {
        f32_avx2(n, w, x, out, 2, 4);
        f32_avx2(n, w + 2, x, out + 8, 2, 4);
    } else if (nw == 4 && nx == 1) {
        f32_avx2(n, w, x, out, 4, 1);
    } else if (nw == 4 && nx == 2) {
        f32_avx2(n, w, x, out, 4, 2);
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

/* Integer path on AVX2, on the packed layouts (repack.h): one 256-bit vector holds 8 rows of a
 * 16-row group (half H = 0, 1), 4 bytes per row lane. vpmaddubsw multiplies u8 x s8 pairwise into
 * int16 and vpmaddwd(., 1) sums those into the row's int32 lane; the 4 activation codes a lane
 * meets are one broadcast 32-bit word. int4: codes 0..15 (u8) x activations: 8 steps of at most
 * 2 * 15 * 127 each stay within int16 (30480), so they add up in int16 before one vpmaddwd; the
 * -8 offset enters as -8 * sum(q) per block. int8: the stored u = w + 128 turns back into signed
 * w (xor 0x80), and |w| x sign(q, w) keeps vpmaddubsw's pairs from saturating. */

AVX2 static INLINE __m256i bcast_codes_avx2(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

AVX2 static INLINE void q8_packed_avx2(int n_blocks, const uint8_t *w, const QAct *const *x,
                                       float *out, int64_t ldo, const int H,
                                       const int NX) {
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    const uint8_t *codes = w + PACK_ROWS * 4;
    __m256 acc[PACK_MAX_NX];
    #pragma GCC unroll 8
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < n_blocks; b++) {
        const uint8_t *rec = codes + b * 512 + 32 * H;
        __m256i ws[8], wa[8];
        #pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            ws[k] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + 64 * k)), flip);
            wa[k] = _mm256_abs_epi8(ws[k]);
        }
        #pragma GCC unroll 8
        for (int r = 0; r < NX; r++) {
            const int8_t *xq = x[r]->q + 32 * b;
            __m256i dot = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m256i p16 = _mm256_maddubs_epi16(
                    wa[k], _mm256_sign_epi8(bcast_codes_avx2(xq + 4 * k), ws[k]));
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p16, ones));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(x[r]->d[b]), acc[r]);
        }
    }
    __m256 sc = _mm256_loadu_ps((const float *)w + 8 * H);
    #pragma GCC unroll 8
    for (int r = 0; r < NX; r++) _mm256_storeu_ps(out + r * ldo + 8 * H, _mm256_mul_ps(acc[r], sc));
}

AVX2 static INLINE void q4_packed_avx2(int n_blocks, const uint8_t *w, const QAct *const *x,
                                       float *out, int64_t ldo, const int H,
                                       const int NX) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[PACK_MAX_NX];
    #pragma GCC unroll 8
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < n_blocks; b++) {
        const uint8_t *rec = w + b * 288;
        if (H == 0 && NX == PACK_MAX_NX) PREFETCH_BLOCK(rec, 288);
        __m256i wv[8];
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 64 * k + 32 * H));
            wv[k] = _mm256_and_si256(v, low4);
            wv[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 256 + 16 * H)));
        #pragma GCC unroll 8
        for (int r = 0; r < NX; r++) {
            const int8_t *xq = x[r]->q + 32 * b;
            __m256i p16 = _mm256_maddubs_epi16(wv[0], bcast_codes_avx2(xq));
            #pragma GCC unroll 8
            for (int k = 1; k < 8; k++) {
                p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(wv[k], bcast_codes_avx2(xq + 4 * k)));
            }
            __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(p16, ones),
                                           _mm256_set1_epi32(x[r]->start4[b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                     _mm256_mul_ps(sw, _mm256_set1_ps(x[r]->d[b])), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NX; r++) _mm256_storeu_ps(out + r * ldo + 8 * H, acc[r]);
}

AVX2 void dot_q8_packed_avx2(int n_blocks, const uint8_t *w, const QAct *const *x, int nx,
                             float *out, int64_t ldo) {
    PACKED_SWITCH(q8_packed_avx2, n_blocks, w, x, out, ldo, 0)
    PACKED_SWITCH(q8_packed_avx2, n_blocks, w, x, out, ldo, 1)
}

AVX2 void dot_q4_packed_avx2(int n_blocks, const uint8_t *w, const QAct *const *x, int nx,
                             float *out, int64_t ldo) {
    PACKED_SWITCH(q4_packed_avx2, n_blocks, w, x, out, ldo, 0)
    PACKED_SWITCH(q4_packed_avx2, n_blocks, w, x, out, ldo, 1)
}

/* vecmat of one row vector: 4 vectors of y (32 columns) in registers over all m rows, then 8
 * columns, then a scalar tail; each column's sum runs over j in order. */
template <typename X>
AVX2 static void vecmat_row_avx2(int n, int m, const float *a, const X *x, int64_t ld,
                                 float *y) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        for (int j = 0; j < m; j++) {
            const __m256 aj = _mm256_set1_ps(a[j]);
            const X *xr = x + j * ld + i;
            c0 = _mm256_fmadd_ps(aj, load8(xr), c0);
            c1 = _mm256_fmadd_ps(aj, load8(xr + 8), c1);
            c2 = _mm256_fmadd_ps(aj, load8(xr + 16), c2);
            c3 = _mm256_fmadd_ps(aj, load8(xr + 24), c3);
        }
        _mm256_storeu_ps(y + i, c0);
        _mm256_storeu_ps(y + i + 8, c1);
        _mm256_storeu_ps(y + i + 16, c2);
        _mm256_storeu_ps(y + i + 24, c3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 c = _mm256_setzero_ps();
        for (int j = 0; j < m; j++) {
            c = _mm256_fmadd_ps(_mm256_set1_ps(a[j]), load8(x + j * ld + i), c);
        }
        _mm256_storeu_ps(y + i, c);
    }
    for (; i < n; i++) {
        float acc = 0.0f;
        for (int j = 0; j < m; j++) acc = fmaf(a[j], to_f32(x[j * ld + i]), acc);
        y[i] = acc;
    }
}

/* vecmat: one row vector at a time (16 ymm registers leave no room for several rows' 4-vector
 * blocks) */
template <typename X>
AVX2 static void vecmat_avx2(int n, int m, const float *const *a, int R, const X *x,
                             int64_t ld, float *const *y) {
    for (int r = 0; r < R; r++) vecmat_row_avx2(n, m, a[r], x, ld, y[r]);
}

/* exp(x) for 8 floats: x = n ln2 + r, |r| <= ln2 / 2, exp(r) = 1 + r + r^2 P(r) with Cephes'
 * expf coefficients, times 2^n through the exponent bits; x clamped to [-87.3, 88.7] (finite). */
AVX2 static INLINE __m256 exp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(r, r), p, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AVX2 static void silu_mul_avx2(int n, float *g, const float *u) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 den = _mm256_add_ps(one, exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
    }
    silu_mul_scalar(n - i, g + i, u + i);
}

/* softmax: scale and max, exp_avx2 and an fp32 lane sum, one multiply by the inverse */
AVX2 static void softmax_avx2(int n, float scale, float *x) {
    const __m256 sc = _mm256_set1_ps(scale);
    int i = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sc);
        _mm256_storeu_ps(x + i, v);
        mv = _mm256_max_ps(mv, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float mx = fmaxf(_mm_cvtss_f32(m4), _mm_cvtss_f32(_mm_shuffle_ps(m4, m4, 1)));
    for (int t = i; t < n; t++) {
        x[t] *= scale;
        mx = fmaxf(mx, x[t]);
    }
    const __m256 mxv = _mm256_set1_ps(mx);
    __m256 sv = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), mxv));
        _mm256_storeu_ps(x + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum256(sv);
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    }
    for (; i < n; i++) x[i] *= 1.0f / sum;
}

/* F16C, 8 values at a time, the tail by the scalar reference (the same bits) */
AVX2 static void f16_to_f32_avx2(int n, const uint16_t *x, float *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    }
    f16_to_f32_scalar(n - i, x + i, y + i);
}

AVX2 static void f32_to_f16_avx2(int n, const float *x, uint16_t *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    f32_to_f16_scalar(n - i, x + i, y + i);
}

static const Kernels AVX2_SET = {"avx2",      dot_avx2<float>,    dot_avx2<uint16_t>, dot_q8_avx2,
                                 dot_q4_avx2, dot_q8_packed_avx2, dot_q4_packed_avx2,
                                 vecmat_avx2<float>, vecmat_avx2<uint16_t>, softmax_avx2,
                                 quantize_q8_0_scalar,            silu_mul_avx2,
                                 transpose_scalar,                f16_to_f32_avx2,
                                 f32_to_f16_avx2};

const Kernels *kernels_avx2() {
    __builtin_cpu_init();
    bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              cpu_has_f16c();
    return ok ? &AVX2_SET : nullptr;
}

}  // namespace ats

#else

namespace ats {
const Kernels *kernels_avx2() { return nullptr; }
}  // namespace ats

#endif
