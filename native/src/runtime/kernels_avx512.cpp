/* AVX-512 kernels (16 floats per vector) and the AVX-512 VNNI integer dots; the layout of every
 * kernel family: kernels_x86.h. */
#include "kernels_x86.h"

#if defined(__x86_64__) || defined(__i386__)

namespace ats {

/* ------------------------------------------------------------------ AVX-512 ------------- */

AVX512 static INLINE __mmask16 tail_mask(int left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* the lanes of k of 16 fp32 values, or of 16 IEEE half ones converted exactly (the others 0) */
AVX512 static INLINE __m512 load16(const float *p, __mmask16 k) {
    return _mm512_maskz_loadu_ps(k, p);
}
AVX512 static INLINE __m512 load16(const uint16_t *p, __mmask16 k) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
}

template <typename W>
AVX512 static INLINE void f32_avx512(int n, const W *const *w, const float *const *x,
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
            __m512 wv = load16(w[i] + k, mk);
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

/* Block shapes: 4x4 (16 accumulators of the 32 zmm registers), 4x1, 4x2, 4x3, 1x4, 1x1. */
template <typename W>
AVX512 static void dot_avx512(int n, const W *const *w, int nw, const float *const *x, int nx,
                              float *out) {
    if (nw == 4 && nx == 4) f32_avx512(n, w, x, out, 4, 4);
    else if (nw == 4 && nx == 1) f32_avx512(n, w, x, out, 4, 1);
    else if (nw == 4 && nx == 2) f32_avx512(n, w, x, out, 4, 2);
    else if (nw == 4 && nx == 3) f32_avx512(n, w, x, out, 4, 3);
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

/* lanes of a 16-float vector still inside a row of `left` columns (0 when left <= 0) */
AVX512 static INLINE __mmask16 left_mask(int left) {
    if (left <= 0) return 0;
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* vecmat block: NV (1..4) vectors of y (columns i .. i + 16 NV, the last ones masked by k) of
 * R (1..4) rows in registers over all m rows of x: each x vector is loaded once for the R rows,
 * and R * NV independent FMA chains hide the FMA latency. */
template <typename X>
AVX512 static INLINE void vecmat_block_avx512(int i, const __mmask16 *k, int m,
                                              const float *const *a, const X *x, int64_t ld,
                                              float *const *y, const int R, const int NV) {
    __m512 c[VECMAT_MAX_ROWS][4];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[r][v] = _mm512_setzero_ps();
    for (int j = 0; j < m; j++) {
        const X *xr = x + j * ld + i;
        __m512 xv[4];
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) xv[v] = load16(xr + 16 * v, k[v]);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 aj = _mm512_set1_ps(a[r][j]);
            #pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_fmadd_ps(aj, xv[v], c[r][v]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_mask_storeu_ps(y[r] + i + 16 * v, k[v], c[r][v]);
}

#define VECMAT_NV_SWITCH(R)                                                     \
    switch (nv) {                                                               \
        case 1: vecmat_block_avx512(i, k, m, a, x, ld, y, R, 1); break;         \
        case 2: vecmat_block_avx512(i, k, m, a, x, ld, y, R, 2); break;         \
        case 3: vecmat_block_avx512(i, k, m, a, x, ld, y, R, 3); break;         \
        default: vecmat_block_avx512(i, k, m, a, x, ld, y, R, 4); break;       \
    }

/* vecmat: blocks of 64 columns, the last one only as many vectors as columns are left (the
 * scores of a row with few keys), each column's sum over j in order as in the scalar set. */
template <typename X>
AVX512 static void vecmat_avx512(int n, int m, const float *const *a, int R, const X *x,
                                 int64_t ld, float *const *y) {
    for (int i = 0; i < n; i += 64) {
        const __mmask16 k[4] = {left_mask(n - i), left_mask(n - i - 16), left_mask(n - i - 32),
                                left_mask(n - i - 48)};
        const int nv = n - i >= 64 ? 4 : (n - i + 15) / 16;
        switch (R) {
            case 1: VECMAT_NV_SWITCH(1) break;
            case 2: VECMAT_NV_SWITCH(2) break;
            case 3: VECMAT_NV_SWITCH(3) break;
            default: VECMAT_NV_SWITCH(4) break;
        }
    }
}

/* exp(x) for 16 floats: as exp_avx2, with 2^n applied by vscalefps. */
AVX512 static INLINE __m512 exp_avx512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(r, r), p, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

AVX512 static void silu_mul_avx512(int n, float *g, const float *u) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = tail_mask(n - i);
        __m512 gv = _mm512_maskz_loadu_ps(mk, g + i);
        __m512 den = _mm512_add_ps(one, exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), gv)));
        __m512 y = _mm512_mul_ps(_mm512_div_ps(gv, den), _mm512_maskz_loadu_ps(mk, u + i));
        _mm512_mask_storeu_ps(g + i, mk, y);
    }
}

/* softmax: as softmax_avx2, tails masked */
AVX512 static void softmax_avx512(int n, float scale, float *x) {
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), sc);
        _mm512_mask_storeu_ps(x + i, mk, v);
        mv = _mm512_mask_max_ps(mv, mk, mv, v);
    }
    const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512 sv = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = tail_mask(n - i);
        __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + i), mxv));
        _mm512_mask_storeu_ps(x + i, mk, e);
        sv = _mm512_mask_add_ps(sv, mk, sv, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), inv));
    }
}

/* ------------------------------------------------------------------ AVX-512 VNNI -------- */
/* Integer path on the packed layouts (repack.h): each 32-bit lane of a 512-bit vector is one
 * weight row of the 16-row group; vpdpbusd adds u8 weight codes x a broadcast of 4 s8 activation
 * codes into it, so 8 steps leave each row's exact block dot in its lane and the block is scaled
 * with one convert and one FMA for all 16 rows. The offsets of the unsigned codes (int8: u = w +
 * 128; int4: c = w + 8) enter as the start value -128 * sum(q) / -8 * sum(q) (QAct.sum). The
 * weight vectors are unpacked once per block for all NX activation rows. Each (row, activation
 * row) result is the same op sequence whatever NX is, so a prefill row equals the same row
 * decoded alone. */

/* acc += vpdpbusd(w, the 4 codes at q broadcast to every lane), the codes read by the
 * instruction's own {1to16} memory broadcast: GCC 12 emits a separate vpbroadcastd for
 * _mm512_set1_epi32 of a load, one more instruction per step (at 8 decode rows the int8 kernel
 * issues 8 of them per row and block, on top of its 8 vpdpbusd). */
#define DPBUSD_BCAST(acc, w, q)                                                   \
    __asm__("vpdpbusd %[m]%{1to16%}, %[wv], %[a]"                                 \
            : [a] "+v"(acc)                                                       \
            : [wv] "v"(w), [m] "m"(*(const int8_t(*)[4])(q)))

AVX512VNNI static INLINE void q8_packed_vnni(int n_blocks, const uint8_t *w, const QAct *const *x,
                                             float *out, int64_t ldo, const int NX) {
    const uint8_t *codes = w + PACK_ROWS * 4;
    __m512 acc[PACK_MAX_NX];
    #pragma GCC unroll 8
    for (int r = 0; r < NX; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < n_blocks; b++) {
        const uint8_t *rec = codes + b * 512;
        __m512i wv[8];
        #pragma GCC unroll 8
        for (int k = 0; k < 8; k++) wv[k] = _mm512_loadu_si512(rec + 64 * k);
        /* all 8 lines loaded here, in address order: left to itself GCC may sink the loads into
         * the dot chain and issue the block's last line first, which at decode (a DRAM-bound
         * stream) defeated the hardware prefetcher and cost ~20% */
        __asm__ volatile("" : "+v"(wv[0]), "+v"(wv[1]), "+v"(wv[2]), "+v"(wv[3]), "+v"(wv[4]),
                         "+v"(wv[5]), "+v"(wv[6]), "+v"(wv[7]));
        #pragma GCC unroll 8
        for (int r = 0; r < NX; r++) {
            const int8_t *xq = x[r]->q + 32 * b;
            __m512i d0 = _mm512_set1_epi32(-128 * x[r]->sum[b]), d1 = _mm512_setzero_si512();
            #pragma GCC unroll 4
            for (int k = 0; k < 8; k += 2) {
                DPBUSD_BCAST(d0, wv[k], xq + 4 * k);
                DPBUSD_BCAST(d1, wv[k + 1], xq + 4 * k + 4);
            }
            __m512i dot = _mm512_add_epi32(d0, d1);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(x[r]->d[b]), acc[r]);
        }
    }
    __m512 sc = _mm512_loadu_ps((const float *)w);
    #pragma GCC unroll 8
    for (int r = 0; r < NX; r++) _mm512_storeu_ps(out + r * ldo, _mm512_mul_ps(acc[r], sc));
}

/* int4: one chain of 8 vpdpbusd per activation row, the NX rows' chains interleaved step by step
 * (NX independent chains hide vpdpbusd's latency; the start value -8 * sum(q) is a broadcast
 * load), then per row one convert, one multiply (weight scale x activation scale) and one FMA.
 * On Zen 4 vpdpbusd, the multiply and the FMA share the two multiply pipes (one 512-bit op per
 * cycle between them; convert, shifts and broadcast loads go elsewhere): 10 such ops per row and
 * block bound the kernel, and at prefill it runs at ~98% of that bound, where two chains per row
 * taken row after row (one more add per row and block, the start value moved in from a general
 * register, the codes broadcast by separate instructions) ran ~1% slower. Under 4 rows (decode)
 * each row keeps two chains: one chain of 8 made decode ~13% slower (fewer blocks' loads in
 * flight). The integer dot is exact either way, so the results are bit-identical. */
AVX512VNNI static INLINE void q4_packed_vnni(int n_blocks, const uint8_t *w, const QAct *const *x,
                                             float *out, int64_t ldo, const int NX) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[PACK_MAX_NX];
    #pragma GCC unroll 8
    for (int r = 0; r < NX; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < n_blocks; b++) {
        const uint8_t *rec = w + b * 288;
        if (NX == PACK_MAX_NX) PREFETCH_BLOCK(rec, 288);
        __m512i wv[8];
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512i v = _mm512_loadu_si512(rec + 64 * k);
            wv[k] = _mm512_and_si512(v, low4);
            wv[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 256)));
        __m512i dot[PACK_MAX_NX], odd[PACK_MAX_NX];
        #pragma GCC unroll 8
        for (int r = 0; r < NX; r++) {
            dot[r] = _mm512_set1_epi32(x[r]->start4[b]);
            odd[r] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            #pragma GCC unroll 8
            for (int r = 0; r < NX; r++) {
                if (NX >= 4 || k % 2 == 0) DPBUSD_BCAST(dot[r], wv[k], x[r]->q + 32 * b + 4 * k);
                else DPBUSD_BCAST(odd[r], wv[k], x[r]->q + 32 * b + 4 * k);
            }
        }
        #pragma GCC unroll 8
        for (int r = 0; r < NX; r++) {
            if (NX < 4) dot[r] = _mm512_add_epi32(dot[r], odd[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]),
                                     _mm512_mul_ps(sw, _mm512_set1_ps(x[r]->d[b])), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NX; r++) _mm512_storeu_ps(out + r * ldo, acc[r]);
}

/* quantize_q8_0 with the same fp32 operations as the scalar reference: vcvtps2dq rounds half to
 * even under the default MXCSR, like lrintf; codes are clamped before narrowing. */
AVX512 static INLINE void quantize_block_avx512(const float *x, __m512 inv, int8_t *q) {
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), inv));
    __m512i c1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), inv));
    c0 = _mm512_min_epi32(_mm512_max_epi32(c0, lo), hi);
    c1 = _mm512_min_epi32(_mm512_max_epi32(c1, lo), hi);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(c0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(c1));
}

/* |x| lane maxima of one 32-element block (16 lanes, the block's max|x| still to reduce) */
AVX512 static INLINE __m512 block_absmax_avx512(const float *x) {
    return _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)),
                         _mm512_abs_ps(_mm512_loadu_ps(x + 16)));
}

/* The maxima over the lanes of m[0..16) in one vector, m[i]'s in lane 4 (i % 4) + i / 4: halves,
 * then quarters, then pairs and single lanes of two vectors meet in one max each (45 shuffles and
 * maxes for 16 blocks, against ~8 dependent ones per block for separate reductions). */
AVX512 static INLINE __m512 lane_max16_avx512(const __m512 *m) {
    __m512 a[8], b[4], c[2];
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        a[i] = _mm512_max_ps(_mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0xEE));
    }
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        b[i] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    }
    #pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        c[i] = _mm512_max_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    return _mm512_max_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* 16 blocks at a time: their max|x| reduced together (lane_max16_avx512), the scales and inverse
 * scales as one vector division each; the rest block by block. The same codes and scales as one
 * block at a time (for inputs without NaN): max is exact in any order, and the divisions are the
 * same IEEE operations. */
AVX512 static void quantize_q8_0_avx512(int n_blocks, const float *x, int8_t *q, float *d) {
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    int b = 0;
    for (; b + 16 <= n_blocks; b += 16) {
        __m512 m[16];
        #pragma GCC unroll 16
        for (int i = 0; i < 16; i++) m[i] = block_absmax_avx512(x + (b + i) * 32);
        const __m512 amax = _mm512_permutexvar_ps(order, lane_max16_avx512(m));
        _mm512_storeu_ps(d + b, _mm512_div_ps(amax, _mm512_set1_ps(127.0f)));
        const __mmask16 nonzero = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ);
        float inv[16];
        _mm512_storeu_ps(inv, _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.0f), amax));
        for (int i = 0; i < 16; i++) {
            quantize_block_avx512(x + (b + i) * 32, _mm512_set1_ps(inv[i]), q + (b + i) * 32);
        }
    }
    for (; b < n_blocks; b++) {
        const float amax = _mm512_reduce_max_ps(block_absmax_avx512(x + b * 32));
        d[b] = amax / 127.0f;
        quantize_block_avx512(x + b * 32, _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f),
                              q + b * 32);
    }
}

AVX512VNNI static void dot_q8_packed_vnni(int n_blocks, const uint8_t *w, const QAct *const *x,
                                          int nx, float *out, int64_t ldo) {
    PACKED_SWITCH(q8_packed_vnni, n_blocks, w, x, out, ldo)
}

AVX512VNNI static void dot_q4_packed_vnni(int n_blocks, const uint8_t *w, const QAct *const *x,
                                          int nx, float *out, int64_t ldo) {
    PACKED_SWITCH(q4_packed_vnni, n_blocks, w, x, out, ldo)
}

/* transpose: 16 x 16 tiles in registers (rows i0.., columns j0..; rows and columns past the ends
 * masked): per 128-bit lane, unpack + shuffle_ps transpose 4 x 4 blocks, so vector 4k + c holds
 * in lane L column 4L + c of rows 4k..4k+3; two shuffle_f32x4 rounds gather the lanes L of
 * vectors c, 4 + c, 8 + c, 12 + c into column 4L + c of all 16 rows. */
AVX512 static void transpose_avx512(int n, int m, const float *const *x, float *y, int64_t ldy) {
    for (int i0 = 0; i0 < n; i0 += 16) {
        const int ni = n - i0 < 16 ? n - i0 : 16;
        const __mmask16 ki = left_mask(ni);
        for (int j0 = 0; j0 < m; j0 += 16) {
            const int nj = m - j0 < 16 ? m - j0 : 16;
            const __mmask16 kj = left_mask(nj);
            __m512 r[16], t[16];
            for (int u = 0; u < 16; u++) {
                r[u] = u < ni ? _mm512_maskz_loadu_ps(kj, x[i0 + u] + j0) : _mm512_setzero_ps();
            }
            for (int u = 0; u < 16; u += 2) {
                t[u] = _mm512_unpacklo_ps(r[u], r[u + 1]);
                t[u + 1] = _mm512_unpackhi_ps(r[u], r[u + 1]);
            }
            for (int u = 0; u < 16; u += 4) {
                r[u] = _mm512_shuffle_ps(t[u], t[u + 2], _MM_SHUFFLE(1, 0, 1, 0));
                r[u + 1] = _mm512_shuffle_ps(t[u], t[u + 2], _MM_SHUFFLE(3, 2, 3, 2));
                r[u + 2] = _mm512_shuffle_ps(t[u + 1], t[u + 3], _MM_SHUFFLE(1, 0, 1, 0));
                r[u + 3] = _mm512_shuffle_ps(t[u + 1], t[u + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int c = 0; c < 4; c++) {
                const __m512 p = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);
                const __m512 q = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
                const __m512 s = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
                const __m512 w = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
                const __m512 col[4] = {_mm512_shuffle_f32x4(p, s, 0x88),
                                       _mm512_shuffle_f32x4(p, s, 0xDD),
                                       _mm512_shuffle_f32x4(q, w, 0x88),
                                       _mm512_shuffle_f32x4(q, w, 0xDD)};
                for (int l = 0; l < 4; l++) {
                    if (4 * l + c < nj) {
                        _mm512_mask_storeu_ps(y + (j0 + 4 * l + c) * ldy + i0, ki, col[l]);
                    }
                }
            }
        }
    }
}

/* 16 values at a time, the tail masked */
AVX512 static void f16_to_f32_avx512(int n, const uint16_t *x, float *y) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, x + i)));
    }
}

AVX512 static void f32_to_f16_avx512(int n, const float *x, uint16_t *y) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(y + i, k, h);
    }
}

/* AVX-512 without VNNI: the AVX2 integer dots (AVX-512BW implies AVX2). */
static const Kernels AVX512_SET = {"avx512",      dot_avx512<float>, dot_avx512<uint16_t>, dot_q8_avx512,
                                   dot_q4_avx512, dot_q8_packed_avx2, dot_q4_packed_avx2,
                                   vecmat_avx512<float>, vecmat_avx512<uint16_t>, softmax_avx512,
                                   quantize_q8_0_avx512,              silu_mul_avx512,
                                   transpose_avx512,  f16_to_f32_avx512, f32_to_f16_avx512};
/* Same name: VNNI only changes how the int8/int4 dots are done. */
static const Kernels AVX512_VNNI_SET = {"avx512",      dot_avx512<float>, dot_avx512<uint16_t>, dot_q8_avx512,
                                        dot_q4_avx512, dot_q8_packed_vnni, dot_q4_packed_vnni,
                                        vecmat_avx512<float>, vecmat_avx512<uint16_t>, softmax_avx512,
                                        quantize_q8_0_avx512,              silu_mul_avx512,
                                        transpose_avx512,  f16_to_f32_avx512, f32_to_f16_avx512};

const Kernels *kernels_avx512() {
    __builtin_cpu_init();
    bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
              cpu_has_f16c();
    if (!ok) return nullptr;
    return __builtin_cpu_supports("avx512vnni") ? &AVX512_VNNI_SET : &AVX512_SET;
}

}  // namespace ats

#else

namespace ats {
const Kernels *kernels_avx512() { return nullptr; }
}  // namespace ats

#endif
