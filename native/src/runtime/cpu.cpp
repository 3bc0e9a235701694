/* ats_cpu_features_get: CPUID flags (GCC/Clang builtins) and the kernel set kernels_get() chose. */
#include "ats/cpu.h"

#include "kernels.h"

extern "C" void ats_cpu_features_get(ats_cpu_features *out) {
    *out = ats_cpu_features();
    out->kernels = ats::kernels_get()->name;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    out->avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    out->fma = __builtin_cpu_supports("fma") ? 1 : 0;
    out->avx512f = __builtin_cpu_supports("avx512f") ? 1 : 0;
    out->avx512bw = __builtin_cpu_supports("avx512bw") ? 1 : 0;
    out->avx512vl = __builtin_cpu_supports("avx512vl") ? 1 : 0;
    out->avx512vnni = __builtin_cpu_supports("avx512vnni") ? 1 : 0;
#endif
#if defined(__aarch64__)
    out->neon = 1;
#endif
}
