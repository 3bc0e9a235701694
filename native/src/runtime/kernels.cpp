/* Runtime choice of the kernel set: the widest ISA the CPU supports (AVX-512, AVX2+FMA, NEON),
 * else the scalar reference. Decided once; the model can also ask for a named set. */
#include "kernels.h"

#include <string>

namespace ats {

const Kernels *kernels_get() {
    static const Kernels *chosen = [] {
        const Kernels *k = kernels_avx512();
        if (!k) k = kernels_avx2();
        if (!k) k = kernels_neon();
        if (!k) k = kernels_scalar();
        return k;
    }();
    return chosen;
}

const Kernels *kernels_by_name(const char *name, std::string *err) {
    std::string n = name ? name : "auto";
    const Kernels *k = nullptr;
    if (n == "auto") return kernels_get();
    if (n == "scalar") k = kernels_scalar();
    else if (n == "avx2") k = kernels_avx2();
    else if (n == "avx512") k = kernels_avx512();
    else if (n == "neon") k = kernels_neon();
    else {
        *err = "kernels '" + n + "' is unknown: expected auto, avx512, avx2, neon or scalar";
        return nullptr;
    }
    if (!k) *err = "kernels '" + n + "' requested, but this CPU (or build) does not support it";
    return k;
}

}  // namespace ats
