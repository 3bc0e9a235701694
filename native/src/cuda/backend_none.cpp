/* The CUDA backend's entry points in a build without it (ATS_CUDA=OFF, the default): device
 * "cuda" fails at model init with a message that says how to build with it. */
#include "backend.h"

namespace ats {

bool cuda_built() { return false; }

bool cuda_model_init(const ats_model *, CudaModel **, std::string *err) {
    *err = "device 'cuda': this ats_native build has no CUDA backend (rebuild with nvcc present "
           "and CMake option ATS_CUDA=ON, e.g. CMAKE_ARGS=-DATS_CUDA=ON uv sync --reinstall-package "
           "ats-native)";
    return false;
}
void cuda_model_free(CudaModel *) {}
bool cuda_session_init(ats_session *, CudaSession **, std::string *err) {
    *err = "no CUDA backend in this build";
    return false;
}
void cuda_session_free(CudaSession *) {}
void cuda_session_reset(ats_session *, int32_t) {}
bool cuda_session_forward(ats_session *, const int32_t *const *, const int32_t *, float *, float *,
                          int32_t *, std::string *err) {
    *err = "no CUDA backend in this build";
    return false;
}

}  // namespace ats
