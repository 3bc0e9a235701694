/* x86 kernels, shared by kernels_avx2.cpp and kernels_avx512.cpp: each kernel is compiled for its
 * ISA with __attribute__((target)) and only called after CPUID says the CPU has it (kernels.cpp).
 * fp32-activation kernels: a block of NW weight rows x NX activation rows keeps NW*NX
 * accumulators in registers; int8 and int4 codes are widened, converted and scaled in registers
 * (one dequantization per weight vector serves all NX activation rows). Integer kernels (packed
 * layouts, repack.h): one weight row per 32-bit lane, NX (1..8) activation rows per call, each
 * block's weight vectors unpacked once for all of them. Block shapes are compile-time constants
 * of always-inline helpers, so each shape gets fully unrolled code. */
#pragma once

#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
/* GCC 12 warns falsely inside its own AVX-512 headers (_mm512_undefined_* idiom). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

/* F16C (cpuid leaf 1, ECX bit 29), read directly: clang 14's __builtin_cpu_supports does not
 * know "f16c" (the fuzz build, native/fuzz/README.md, is clang's) */
static inline bool cpu_has_f16c() {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

/* nx = 1..PACK_MAX_NX as compile-time shapes; the two 8-row halves one after the other */
#define PACKED_SWITCH(KERNEL, ...)                      \
    switch (nx) {                                       \
        case 1: KERNEL(__VA_ARGS__, 1); break;          \
        case 2: KERNEL(__VA_ARGS__, 2); break;          \
        case 3: KERNEL(__VA_ARGS__, 3); break;          \
        case 4: KERNEL(__VA_ARGS__, 4); break;          \
        case 5: KERNEL(__VA_ARGS__, 5); break;          \
        case 6: KERNEL(__VA_ARGS__, 6); break;          \
        case 7: KERNEL(__VA_ARGS__, 7); break;          \
        default: KERNEL(__VA_ARGS__, 8); break;         \
    }

/* The packed int4 kernels' software prefetch, in calls of PACK_MAX_NX activation rows only: the
 * cache lines of the block PREFETCH_AHEAD bytes on (16 blocks). A step of 8 decoding sequences
 * reads each weight from DRAM once, slowly enough (8 rows of dots per block) that the hardware
 * prefetcher fell behind: one core streamed int4 weights at 0.55 of the kernel's in-cache rate
 * (AVX-512 VNNI; AVX2 0.66-0.67), 0.72-0.74 (AVX2 0.78-0.79) with the prefetch
 * (benchmarks/packed_stream.py).
 * With fewer rows the stream itself is the bound and prefetches only took issue slots (1 and 2
 * rows ran 20-30% slower with them), so those calls have none. The int8 kernels have none either: at 8
 * rows the AVX-512 one gained nothing, and in the AVX2 one the prefetch changed the code GCC made
 * for its 1-row calls, which streamed 17% slower. */
#define PREFETCH_AHEAD 4608
#define PREFETCH_BLOCK(rec, bytes)                                                       \
    _Pragma("GCC unroll 8") for (int l = 0; l < ((bytes) + 63) / 64; l++)                \
        __builtin_prefetch((rec) + PREFETCH_AHEAD + 64 * l, 0, 3)

namespace ats {

/* The AVX2 integer dots on the packed layouts, which the AVX-512 set without VNNI reuses
 * (AVX-512BW implies AVX2). */
AVX2 void dot_q8_packed_avx2(int n_blocks, const uint8_t *w, const QAct *const *x, int nx,
                             float *out, int64_t ldo);
AVX2 void dot_q4_packed_avx2(int n_blocks, const uint8_t *w, const QAct *const *x, int nx,
                             float *out, int64_t ldo);

}  // namespace ats

#endif
