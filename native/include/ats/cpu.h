/* What the CPU offers and which kernel set the runtime picked for it (C API). */
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *kernels; /* kernel set chosen: "avx512", "avx2", "neon" or "scalar" (static) */
    int avx2;            /* 1 if the CPU has AVX2 */
    int fma;             /* 1 if the CPU has FMA3 */
    int avx512f;         /* 1 if the CPU has AVX-512 F */
    int avx512bw;        /* 1 if the CPU has AVX-512 BW */
    int avx512vl;        /* 1 if the CPU has AVX-512 VL */
    int avx512vnni;      /* 1 if the CPU has AVX-512 VNNI */
    int neon;            /* 1 on aarch64 (NEON is part of the base ISA) */
} ats_cpu_features;

void ats_cpu_features_get(ats_cpu_features *out);

/* Measured peak multiply-adds per second on n_threads threads (1..ats_threads_max(): ats/threads.h)
 * each running `seconds` (0 < s <= 60) of kind "int8" (int8 x int8 dot products: AVX-512 VNNI vpdpbusd, else AVX2 vpmaddubsw +
 * vpmaddwd) or "fp32" (FMA, zmm else ymm), register-only loops. Returns -1 with err set on an
 * unknown kind, bad arguments, or a CPU without AVX2. */
double ats_cpu_peak(const char *kind, int n_threads, double seconds, char *err, size_t err_cap);

#ifdef __cplusplus
}
#endif
