/* y = x @ W^T for a weight matrix W (rows = out features, cols = in features) stored as fp32,
 * int8 per output channel, or int4 in groups (see briefs/native_runtime.md), on the thread pool. */
#pragma once
#include <stdint.h>

#include "kernels.h"
#include "threadpool.h"

namespace ats {

enum WeightType { WEIGHT_F32 = 0, WEIGHT_Q8 = 1, WEIGHT_Q4 = 2 };

/* One 2-D weight (or one expert's slice of a stacked 3-D weight). Plain view, owns nothing. */
struct Weight {
    WeightType type = WEIGHT_F32;
    int64_t rows = 0;            /* out features */
    int64_t cols = 0;            /* in features */
    const float *f32 = nullptr;  /* WEIGHT_F32: rows * cols */
    const int8_t *q8 = nullptr;  /* WEIGHT_Q8: rows * cols codes, w = q * scale[row] */
    const uint8_t *q4 = nullptr; /* WEIGHT_Q4: rows * cols / 2 bytes, low nibble = even column */
    const float *scale = nullptr; /* Q8: rows; Q4: rows * (cols / group) */
    int group = 0;               /* Q4 group size (32, 64 or 128) */
    const uint8_t *packed = nullptr; /* Q8/Q4 repacked at load (repack.h), or NULL */
    int64_t packed_stride = 0;       /* bytes of one matrix's packed copy (experts are stacked) */
};

/* Expert e of a stacked weight holding n_stack matrices of rows x cols each. */
Weight weight_slice(const Weight &stacked, int64_t e);

/* y (N, W.rows) = x (N, W.cols) @ W^T. int8/int4 W with W.cols % 32 == 0 on a kernel set with
 * integer dots: x is quantized per 32-block to int8 first (Q8_0 activations, see matmul.cpp). */
void matmul(ThreadPool *pool, const Kernels *k, const Weight &w, const float *x, int64_t N,
            float *y);

}  // namespace ats
