/* y = x @ W^T for a weight matrix W (rows = out features, cols = in features) stored as fp32,
 * int8 per output channel, or int4 in groups (see briefs/native_runtime.md), on the thread pool. */
#pragma once
#include <stdint.h>

#include <vector>

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

/* y (N, W.rows) = x (N, W.cols) @ W^T. int8/int4 W repacked at load (W.packed, repack.h): x is
 * quantized per 32-block to int8 first (Q8_0 activations, see matmul.cpp). */
void matmul(ThreadPool *pool, const Kernels *k, const Weight &w, const float *x, int64_t N,
            float *y);

/* Storage behind the QAct rows (kernels.h) of N activation rows; reused across calls. */
struct QActRows {
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> sum;
    std::vector<int32_t> start4;
    std::vector<QAct> rows;
};

/* Sizes a for N rows of C activations (C % 32 == 0) without filling them. */
void qact_resize(QActRows *a, int64_t N, int64_t C);

/* Quantizes one row x (C) into row n of a (sized by qact_resize): lets a pool task that makes
 * the row (RMSNorm, SwiGLU's gate) quantize it while it is in L1, without a job of its own. */
void qact_row(const Kernels *k, const float *x, int64_t C, int64_t n, QActRows *a);

/* Quantizes x (N, C), C % 32 == 0, into a->rows[0..N) (rows spread over the pool). */
void qact_build(ThreadPool *pool, const Kernels *k, const float *x, int64_t N, int64_t C,
                QActRows *a);

/* One matmul on a packed weight (w.packed set): y (N, w.rows) = x @ w^T for the QAct rows
 * x[0..N). */
struct MatmulJob {
    Weight w;
    const QAct *x;
    int64_t N;
    float *y;
};

/* Runs several packed matmuls as ONE pool job (tasks = row-group ranges of every job), so a decode
 * step pays one wake-up for, e.g., q/k/v or the gate and up projections of all chosen experts. */
void matmul_jobs(ThreadPool *pool, const Kernels *k, const MatmulJob *jobs, int n_jobs);

/* y[i] (N, w[i].rows) = x (N, C) @ w[i]^T for n weights on the same input (q/k/v): when all are
 * packed, x is quantized once and the n matmuls run as one pool job; else one matmul each. */
void matmul_same_x(ThreadPool *pool, const Kernels *k, const Weight *const *w, int n,
                   const float *x, int64_t N, float *const *y);

}  // namespace ats
