/* The C API of include/ats/half.h: the kernel set's half-precision conversions, in chunks. */
#include "ats/half.h"

#include <string>

#include "forward.h"

using namespace ats;

extern "C" int ats_half_round(const char *kernels, const float *x, int64_t n, float *y, char *err,
                              size_t err_cap) {
    std::string msg;
    const Kernels *k = kernels_by_name(kernels, &msg);
    if (!k) {
        set_err(err, err_cap, msg);
        return -1;
    }
    if (n < 0) {
        set_err(err, err_cap, "n = " + std::to_string(n) + ": expected >= 0");
        return -1;
    }
    uint16_t h[256];
    for (int64_t i = 0; i < n; i += 256) {
        const int m = (int)(n - i < 256 ? n - i : 256);
        k->f32_to_f16(m, x + i, h);
        k->f16_to_f32(m, h, y + i);
    }
    return 0;
}
