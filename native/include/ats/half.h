/* IEEE half precision rounding as the f16 KV cache does it (C API): for kernel tests against a
 * reference. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] = x[i] rounded to half precision and back (the kernel set's f32_to_f16 then f16_to_f32,
 * as a key or value goes into the f16 cache and comes out), i < n. kernels: "auto" (NULL = auto)
 * or a named set, as ats_model_params.kernels. Returns 0, or -1 with err set on an unknown or
 * unsupported set or n < 0. */
int ats_half_round(const char *kernels, const float *x, int64_t n, float *y, char *err,
                   size_t err_cap);

#ifdef __cplusplus
}
#endif
