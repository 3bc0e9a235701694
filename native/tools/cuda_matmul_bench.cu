/* Times each matmul kernel of the CUDA backend alone (gpu_matmul, as the forward pass calls it)
 * on the matrices of a ~1B dense model (dim 2048, GQA 32/8 heads of 64, SwiGLU 5632, vocab
 * 32000: benchmarks/native_cuda.py's dense-1b), for bf16, int8 and int4 (groups of 32) weights
 * and N activation rows, against the device's copy bandwidth: which shape and which kernel
 * leave bandwidth unused. int8 / int4 with N > 1 twice: the tensor-core kernel ("mma") and the
 * warp kernel ("warp"). Each measurement replays a CUDA graph of 32 back-to-back launches
 * cycling through enough copies of the weight (>= 256 MiB together) that none is still in L2.
 * Prints one JSON line per measurement: weight GB/s = weight bytes (int8 row scales, int4 fp16
 * group scales included) / time, of_copy = that / the copy bandwidth (cudaMemcpy of 1 GiB
 * device to device, bytes read + written, best of 5). N = 1 twice: launches without and with
 * programmatic dependent launch ("pdl", as the decode graph launches them: a matmul's weight
 * loads overlap the previous launch). Before timing, each int8 / int4 matrix checks that the
 * one-row kernel's outputs equal the N = 2 kernels' bit for bit (exit status 1 if not).
 * Built with ATS_CUDA=ON (native/tools/cuda_check.sh); run: cuda_matmul_bench [N ...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "../src/cuda/kernels.cuh"

using namespace ats;

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(e_));                                           \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static double copy_bandwidth(cudaStream_t st) {
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        CHECK(cudaEventRecord(e0, st));
        CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i > 0 && ms < best) best = ms;
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes / (best * 1e-3);
}

/* p[i] = bytes of a hash of (i, seed); as floats (n / 4 of them): in [lo, lo + 1) */
__global__ void fill_hash(uint32_t *p, int64_t n, uint32_t seed, int as_float, float lo) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        if (as_float) {
            ((float *)p)[i] = lo + (float)(h >> 8) * (1.0f / 16777216.0f);
        } else {
            p[i] = h;
        }
    }
}

static void fill(void *p, size_t bytes, uint32_t seed, bool as_float = false, float lo = 0.0f) {
    fill_hash<<<1024, 256>>>((uint32_t *)p, (int64_t)(bytes / 4), seed, as_float, lo);
    CHECK(cudaGetLastError());
}

/* The one-row kernel's outputs equal, bit for bit, those of both N = 2 kernels (tensor cores and
 * warp kernel) on the same activation row twice, for random weights, scales and activations
 * (int8 codes may be -128 here; sums stay exact). Returns the number of mismatches. */
static int64_t check_one_row(const GpuWeight &w, cudaStream_t st) {
    const int64_t C = w.cols, R = w.rows;
    int8_t *xq;
    float *xd, *y1, *y2;
    CHECK(cudaMalloc(&xq, 2 * C));
    CHECK(cudaMalloc(&xd, 2 * C / 32 * 4));
    CHECK(cudaMalloc(&y1, R * 4));
    CHECK(cudaMalloc(&y2, 2 * R * 4));
    fill(xq, C, 7);
    fill(xd, C / 32 * 4, 8, true, 0.001f);
    CHECK(cudaMemcpy(xq + C, xq, C, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(xd + C / 32, xd, C / 32 * 4, cudaMemcpyDeviceToDevice));
    gpu_matmul(w, nullptr, GpuQAct{xq, xd}, 1, y1, st);
    std::vector<float> a((size_t)R), b((size_t)(2 * R));
    CHECK(cudaMemcpyAsync(a.data(), y1, R * 4, cudaMemcpyDeviceToHost, st));
    CHECK(cudaStreamSynchronize(st));
    int64_t bad = 0;
    for (int mma = 1; mma >= 0; mma--) {
        gpu_set_mma(mma == 1);
        gpu_matmul(w, nullptr, GpuQAct{xq, xd}, 2, y2, st);
        CHECK(cudaMemcpyAsync(b.data(), y2, 2 * R * 4, cudaMemcpyDeviceToHost, st));
        CHECK(cudaStreamSynchronize(st));
        for (int64_t i = 0; i < 2 * R; i++) {
            bad += memcmp(&a[(size_t)(i % R)], &b[(size_t)i], 4) != 0;
        }
    }
    gpu_set_mma(true);
    cudaFree(xq);
    cudaFree(xd);
    cudaFree(y1);
    cudaFree(y2);
    return bad;
}

struct Shape {
    const char *name;
    int64_t rows, cols;
};

int main(int argc, char **argv) {
    std::vector<int64_t> Ns;
    for (int i = 1; i < argc; i++) Ns.push_back(atoll(argv[i]));
    if (Ns.empty()) Ns = {1, 2, 8, 16, 32, 128};
    int64_t n_max = 1;
    for (int64_t n : Ns) n_max = n > n_max ? n : n_max;
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const double copy = copy_bandwidth(st);
    printf("{\"name\": \"device-copy-bandwidth\", \"GBps\": %.1f, \"hardware\": \"%s\"}\n",
           copy / 1e9, prop.name);
    const Shape shapes[] = {{"wqkv", 3072, 2048},
                            {"wo", 2048, 2048},
                            {"w13", 11264, 2048},
                            {"w2", 2048, 5632},
                            {"output", 32000, 2048}};
    const GpuWeightType types[] = {GPU_BF16, GPU_Q8, GPU_Q4};
    const char *type_names[] = {"f32", "bf16", "int8", "int4-g32"};
    const int LAUNCHES = 32, REPS = 10;
    int failed = 0;
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (const Shape &sh : shapes) {
        const int64_t C = sh.cols, R = sh.rows;
        float *x, *y, *xd;
        int8_t *xq;
        CHECK(cudaMalloc(&x, n_max * C * 4));
        CHECK(cudaMalloc(&y, n_max * R * 4));
        CHECK(cudaMalloc(&xq, n_max * C));
        CHECK(cudaMalloc(&xd, n_max * C / 32 * 4));
        CHECK(cudaMemset(x, 0, n_max * C * 4));
        CHECK(cudaMemset(xq, 3, n_max * C));
        CHECK(cudaMemset(xd, 0, n_max * C / 32 * 4));
        for (GpuWeightType type : types) {
            const size_t data = type == GPU_BF16 ? R * C * 2 : type == GPU_Q8 ? R * C : R * C / 2;
            const size_t scales = type == GPU_Q8 ? R * 4 : type == GPU_Q4 ? R * C / 32 * 2 : 0;
            const size_t bytes = data + scales;
            const int copies = (int)(((size_t)256 << 20) / bytes + 1);
            std::vector<GpuWeight> ws((size_t)copies);
            std::vector<void *> allocs;
            for (GpuWeight &w : ws) {
                void *d, *s = nullptr;
                CHECK(cudaMalloc(&d, data));
                CHECK(cudaMemset(d, 0x11, data));
                allocs.push_back(d);
                if (scales) {
                    CHECK(cudaMalloc(&s, scales));
                    CHECK(cudaMemset(s, 0, scales));
                    allocs.push_back(s);
                }
                w.type = type;
                w.rows = R;
                w.cols = C;
                w.data = d;
                w.scale = type == GPU_Q8 ? (const float *)s : nullptr;
                w.scale4 = type == GPU_Q4 ? (const __half *)s : nullptr;
                w.group = type == GPU_Q4 ? 32 : 0;
            }
            if (type == GPU_Q8 || type == GPU_Q4) {
                GpuWeight &w = ws[0];
                fill((void *)w.data, data, 1);
                if (type == GPU_Q8) fill((void *)w.scale, scales, 2, true, 0.5f);
                if (type == GPU_Q4) { /* fp16 scales in [1/64, 1/32) */
                    std::vector<uint16_t> h(scales / 2);
                    for (size_t i = 0; i < h.size(); i++) h[i] = (uint16_t)(0x2400 | (i * 7919u & 0x3ff));
                    CHECK(cudaMemcpy((void *)w.scale4, h.data(), scales, cudaMemcpyHostToDevice));
                }
                const int64_t bad = check_one_row(w, st);
                printf("{\"weights\": \"%s\", \"matrix\": \"%s\", \"check\": \"one row == "
                       "N = 2 (mma, warp)\", \"mismatches\": %lld}\n",
                       type_names[type], sh.name, (long long)bad);
                if (bad) failed = 1;
            }
            for (int64_t N : Ns) {
                const bool q = type == GPU_Q8 || type == GPU_Q4;
                for (int v = 0; v < (N == 1 ? 2 : q ? 2 : 1); v++) {
                    /* N = 1: without and with PDL; N > 1: mma, then the warp kernel */
                    const int mma = N == 1 || v == 0, pdl = N == 1 && v == 1;
                    gpu_set_mma(mma == 1);
                    gpu_set_pdl(pdl == 1);
                    cudaGraph_t graph;
                    cudaGraphExec_t exec;
                    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                    for (int i = 0; i < LAUNCHES; i++) {
                        gpu_matmul(ws[(size_t)(i % copies)], x, GpuQAct{xq, xd}, N, y, st);
                    }
                    CHECK(cudaStreamEndCapture(st, &graph));
                    gpu_set_pdl(false);
                    CHECK(cudaGraphInstantiate(&exec, graph, 0));
                    CHECK(cudaGraphLaunch(exec, st));
                    CHECK(cudaEventRecord(e0, st));
                    for (int r = 0; r < REPS; r++) CHECK(cudaGraphLaunch(exec, st));
                    CHECK(cudaEventRecord(e1, st));
                    CHECK(cudaEventSynchronize(e1));
                    float ms;
                    CHECK(cudaEventElapsedTime(&ms, e0, e1));
                    cudaGraphExecDestroy(exec);
                    cudaGraphDestroy(graph);
                    const double sec = ms * 1e-3 / (LAUNCHES * REPS), gbps = bytes / sec;
                    printf("{\"weights\": \"%s\", \"matrix\": \"%s\", \"rows\": %lld, \"cols\": "
                           "%lld, \"N\": %lld, \"kernel\": \"%s\", \"us\": %.2f, \"GBps\": "
                           "%.1f, \"of_copy\": %.3f, \"pdl\": %s}\n",
                           type_names[type], sh.name, (long long)R, (long long)C, (long long)N,
                           N == 1 ? (q ? "matvec" : "warp") : !q ? "warp" : mma ? "mma" : "warp",
                           sec * 1e6, gbps / 1e9,
                           gbps / copy, pdl ? "true" : "false");
                    fflush(stdout);
                }
            }
            gpu_set_mma(true);
            for (void *p : allocs) cudaFree(p);
        }
        cudaFree(x);
        cudaFree(y);
        cudaFree(xq);
        cudaFree(xd);
    }
    CHECK(cudaGetLastError());
    return failed;
}
