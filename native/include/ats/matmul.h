/* One int8/int4 matmul through the model runtime's own path (C API): load-time repacking,
 * activation quantization and the kernel set, exactly as a model's matmuls run them. For kernel
 * tests against a reference and for kernel benchmarks. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *kernels; /* "auto" (NULL = auto) or a named set, as ats_model_params.kernels */
    int n_threads;       /* compute threads, 1..ats_threads_max() (ats/threads.h) */
    int bits;            /* 8: int8 codes (rows, cols), scale (rows);
                            4: uint8 codes (rows, cols / 2), low nibble = even column,
                               weight (code - 8) * scale, scale (rows, cols / group) */
    int group;           /* int4 group size: 32, 64 or 128 (unused for 8 bits) */
} ats_matmul_params;

/* y (n, rows) = x (n, cols) @ W^T for W given by codes and scale (layouts above, as
 * ats_infer.quantize writes them). Returns 0, or -1 with err set on bad parameters. */
int ats_matmul_quantized(const ats_matmul_params *params, const void *codes, const float *scale,
                         int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                         char *err, size_t err_cap);

#ifdef __cplusplus
}
#endif
