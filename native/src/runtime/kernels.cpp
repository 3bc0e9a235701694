/* Runtime choice of the kernel set: the widest ISA the CPU supports (AVX-512, AVX2+FMA, NEON),
 * else the scalar reference. Decided once; the model can also ask for a named set. */
#include "kernels.h"

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

}  // namespace ats
