// One thread, one packed integer kernel (native/src/runtime/kernels.h: dot_q4_packed /
// dot_q8_packed) over a buffer of row groups, swept `sweeps` times, NX activation rows per call:
// prints "GMAC/s GB/s" (multiply-adds, weight bytes read). A buffer of a few row groups stays in
// L1/L2 (the kernel's in-cache rate); hundreds of MB stream from DRAM each sweep (decode, where
// every weight is read once per step). Built and run by benchmarks/packed_stream.py.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels.h"

using namespace ats;

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: loop KERNELS BITS NX GROUPS SWEEPS N_BLOCKS\n");
        return 2;
    }
    std::string err;
    const Kernels *k = kernels_by_name(argv[1], &err);
    if (!k || !k->dot_q4_packed) {
        fprintf(stderr, "%s\n", k ? "this set has no packed kernels" : err.c_str());
        return 2;
    }
    const int bits = atoi(argv[2]), nx = atoi(argv[3]), nb = atoi(argv[6]);
    const long long groups = atoll(argv[4]), sweeps = atoll(argv[5]);
    if ((bits != 4 && bits != 8) || nx < 1 || nx > PACK_MAX_NX || groups < 1 || sweeps < 1 ||
        nb < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    /* repack.h's layouts: int4 288 bytes per block; int8 16 fp32 row scales then 512 per block.
     * The contents are arbitrary (timing only); the int4 fp16 scales are set to 1.0 */
    const long long group_bytes = bits == 4 ? 288LL * nb : 64 + 512LL * nb;
    std::vector<uint8_t> w((size_t)(groups * group_bytes));
    for (size_t i = 0; i < w.size(); i++) w[i] = (uint8_t)((i * 2654435761u) >> 13);
    if (bits == 4) {
        for (long long g = 0; g < groups * nb; g++) {
            for (int l = 0; l < 16; l++) {
                w[(size_t)(g * 288 + 256 + 2 * l)] = 0x00;
                w[(size_t)(g * 288 + 257 + 2 * l)] = 0x3C;
            }
        }
    }
    std::vector<int8_t> q((size_t)nx * nb * 32);
    for (size_t i = 0; i < q.size(); i++) q[i] = (int8_t)((int)(i * 7919 % 255) - 127);
    std::vector<float> d((size_t)nx * nb, 0.01f);
    std::vector<int32_t> sum((size_t)nx * nb, 0), start4((size_t)nx * nb, 0);
    std::vector<QAct> qa((size_t)nx);
    const QAct *qp[PACK_MAX_NX];
    for (int r = 0; r < nx; r++) {
        qa[r] = {q.data() + r * nb * 32, d.data() + r * nb, sum.data() + r * nb,
                 start4.data() + r * nb};
        qp[r] = &qa[r];
    }
    std::vector<float> out((size_t)(nx * 16 * groups));
    auto dot = bits == 4 ? k->dot_q4_packed : k->dot_q8_packed;
    const auto t0 = std::chrono::steady_clock::now();
    for (long long s = 0; s < sweeps; s++) {
        for (long long g = 0; g < groups; g++) {
            dot(nb, w.data() + g * group_bytes, qp, nx, out.data() + g * 16, 16 * groups);
        }
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double macs = (double)sweeps * groups * 16 * nb * 32 * nx;
    printf("%.2f %.3f\n", macs / sec / 1e9, (double)sweeps * groups * group_bytes / sec / 1e9);
    return 0;
}
