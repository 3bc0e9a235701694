/* What the CPU offers and which kernel set the runtime picked for it (C API). */
#pragma once

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

#ifdef __cplusplus
}
#endif
