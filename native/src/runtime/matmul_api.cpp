/* The C API of include/ats/matmul.h: one quantized matmul on a temporary thread pool, with the
 * weight repacked first when the kernel set streams a packed layout (as model loading does). */
#include "ats/matmul.h"

#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "../threads.h"
#include "forward.h"
#include "repack.h"

using namespace ats;

static int matmul_quantized(const ats_matmul_params *p, const void *codes, const float *scale,
                            int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                            std::string *err) {
    if (!p || !codes || !scale || !x || !y) {
        *err = "ats_matmul_quantized: NULL argument";
        return -1;
    }
    if (p->n_threads < 1) {
        *err = "n_threads = " + std::to_string(p->n_threads) + ": expected >= 1";
        return -1;
    }
    if (threads_resolve(p->n_threads, "n_threads", err) < 0) return -1;
    if (rows < 1 || cols < 1 || n < 0) {
        *err = "shape rows = " + std::to_string(rows) + ", cols = " + std::to_string(cols) +
               ", n = " + std::to_string(n) + ": expected rows, cols >= 1 and n >= 0";
        return -1;
    }
    Weight w;
    w.rows = rows;
    w.cols = cols;
    if (p->bits == 8) {
        w.type = WEIGHT_Q8;
        w.q8 = (const int8_t *)codes;
    } else if (p->bits == 4) {
        if (p->group != 32 && p->group != 64 && p->group != 128) {
            *err = "group = " + std::to_string(p->group) + ": expected 32, 64 or 128";
            return -1;
        }
        if (cols % p->group != 0) {
            *err = "cols = " + std::to_string(cols) + " is not divisible by group " +
                   std::to_string(p->group);
            return -1;
        }
        w.type = WEIGHT_Q4;
        w.q4 = (const uint8_t *)codes;
        w.group = p->group;
    } else {
        *err = "bits = " + std::to_string(p->bits) + ": expected 8 or 4";
        return -1;
    }
    w.scale = scale;
    const Kernels *k = kernels_by_name(p->kernels, err);
    if (!k) return -1;
    std::unique_ptr<ThreadPool> pool_owner;
    try {
        pool_owner.reset(new ThreadPool(p->n_threads));
    } catch (const std::runtime_error &e) {
        *err = e.what();
        return -1;
    }
    ThreadPool &pool = *pool_owner;
    std::vector<uint8_t> packed;
    if ((w.type == WEIGHT_Q8 ? k->dot_q8_packed : k->dot_q4_packed) && cols % 32 == 0) {
        if (!pack_check(w, err)) return -1;
        packed.resize((size_t)packed_bytes(w));
        pack_matrix(&pool, w, packed.data());
        w.packed = packed.data();
        w.packed_stride = (int64_t)packed.size();
    }
    matmul(&pool, k, w, x, n, y);
    return 0;
}

extern "C" int ats_matmul_quantized(const ats_matmul_params *params, const void *codes,
                                    const float *scale, int64_t rows, int64_t cols,
                                    const float *x, int64_t n, float *y, char *err,
                                    size_t err_cap) {
    std::string msg;
    try {
        int rc = matmul_quantized(params, codes, scale, rows, cols, x, n, y, &msg);
        if (rc != 0) set_err(err, err_cap, msg);
        return rc;
    } catch (const std::bad_alloc &) {
        set_err(err, err_cap, "out of memory in ats_matmul_quantized");
        return -1;
    }
}
