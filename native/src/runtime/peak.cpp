/* Measured peak multiply-add rate of this CPU (issue 7's benchmark puts prefill against it):
 * every thread runs 16 independent accumulator chains of the widest integer dot (AVX-512 VNNI
 * vpdpbusd: 64 int8 multiply-adds per instruction; else AVX2 vpmaddubsw + vpmaddwd) or fp32 FMA
 * (zmm, else ymm) for a fixed time. No memory traffic: an upper bound no matmul can beat. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../threads.h"
#include "ats/cpu.h"
#include "forward.h"

#if defined(__x86_64__) || defined(__i386__)
/* GCC 12 warns falsely inside its own AVX-512 headers (_mm512_undefined_* idiom). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2,fma")))
#endif

namespace ats {

static const int64_t ROUND = 1 << 16; /* loop iterations between clock reads */

#if defined(__x86_64__) || defined(__i386__)
/* Each returns the multiply-adds done in `rounds` rounds; the sink keeps the chains alive. */
VNNI static int64_t peak_int8_vnni(int64_t rounds, volatile int32_t *sink) {
    __m512i acc[16];
    const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < rounds * ROUND; it++) {
        #pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    }
    __m512i s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_epi32(s, acc[i]);
    *sink = _mm512_reduce_add_epi32(s);
    return rounds * ROUND * 16 * 64;
}

AVX512 static int64_t peak_fp32_avx512(int64_t rounds, volatile int32_t *sink) {
    __m512 acc[16];
    const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < rounds * ROUND; it++) {
        #pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    *sink = (int32_t)_mm512_reduce_add_ps(s);
    return rounds * ROUND * 16 * 16;
}

AVX2 static int64_t peak_int8_avx2(int64_t rounds, volatile int32_t *sink) {
    /* each chain's own bytes are the u8 operand, so the products cannot be hoisted */
    __m256i acc[12];
    const __m256i b = _mm256_set1_epi8(-1), ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_epi32(i);
    for (int64_t it = 0; it < rounds * ROUND; it++) {
        #pragma GCC unroll 12
        for (int i = 0; i < 12; i++) {
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(acc[i], b), ones));
        }
    }
    int32_t out[8];
    __m256i s = acc[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_epi32(s, acc[i]);
    _mm256_storeu_si256((__m256i *)out, s);
    *sink = out[0];
    return rounds * ROUND * 12 * 32;
}

AVX2 static int64_t peak_fp32_avx2(int64_t rounds, volatile int32_t *sink) {
    __m256 acc[16];
    const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 16; i++) acc[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < rounds * ROUND; it++) {
        #pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
    float out[8];
    __m256 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm256_add_ps(s, acc[i]);
    _mm256_storeu_ps(out, s);
    *sink = (int32_t)out[0];
    return rounds * ROUND * 16 * 8;
}
#endif

typedef int64_t (*PeakLoop)(int64_t rounds, volatile int32_t *sink);

static PeakLoop peak_loop(const std::string &kind, std::string *err) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2") &&
                                                           __builtin_cpu_supports("fma");
    if (kind == "int8" && avx512 && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni")) {
        return peak_int8_vnni;
    }
    if (kind == "int8" && avx2) return peak_int8_avx2;
    if (kind == "fp32" && avx512) return peak_fp32_avx512;
    if (kind == "fp32" && avx2) return peak_fp32_avx2;
#endif
    if (kind != "int8" && kind != "fp32") *err = "kind '" + kind + "' is unknown: expected int8 or fp32";
    else *err = "cpu_peak needs AVX2+FMA or AVX-512 (this CPU or build has neither)";
    return nullptr;
}

}  // namespace ats

using namespace ats;

extern "C" double ats_cpu_peak(const char *kind, int n_threads, double seconds, char *err,
                               size_t err_cap) {
    std::string msg;
    PeakLoop loop = peak_loop(kind ? kind : "", &msg);
    if (!loop) {
        set_err(err, err_cap, msg);
        return -1.0;
    }
    if (threads_resolve(n_threads, "threads", &msg) < 0) {
        set_err(err, err_cap, msg);
        return -1.0;
    }
    if (n_threads < 1 || !(seconds > 0.0 && seconds <= 60.0)) {
        set_err(err, err_cap, "threads = " + std::to_string(n_threads) + ", seconds = " +
                                  std::to_string(seconds) + ": expected threads >= 1 and 0 < seconds <= 60");
        return -1.0;
    }
    std::vector<double> rate((size_t)n_threads, 0.0);
    std::vector<std::thread> threads;
    std::atomic<bool> abandon(false); /* a thread failed to start: the others stop early */
    auto measure = [&](int t) {
        volatile int32_t sink = 0;
        auto start = std::chrono::steady_clock::now();
        int64_t macs = 0;
        double elapsed = 0.0;
        while (elapsed < seconds && !abandon.load(std::memory_order_relaxed)) {
            macs += loop(1, &sink);
            elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
        rate[(size_t)t] = (double)macs / elapsed;
    };
    if (!threads_start(n_threads, measure, &threads, [&] { abandon.store(true); }, &msg)) {
        set_err(err, err_cap, msg);
        return -1.0;
    }
    for (std::thread &th : threads) th.join();
    double total = 0.0;
    for (double r : rate) total += r;
    return total;
}
