/* safetensors files: mmap, and a header parser that validates everything (header length, JSON
 * shape, dtypes, shapes, byte sizes, offsets inside the data area, no overlap) before any tensor
 * byte is touched. Internal to the runtime. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <string>
#include <vector>

namespace ats {

/* The largest header safetensors itself accepts (100 MB); anything bigger is a corrupt length. */
const uint64_t ST_MAX_HEADER_BYTES = 100000000ull;

struct StTensor {
    std::string name;
    std::string dtype;          /* "F32", "BF16", "I8", "U8", ... */
    std::vector<int64_t> shape; /* dimensions */
    const uint8_t *data;        /* first byte inside the mapped file */
    size_t nbytes;              /* product(shape) * element size */
};

struct StFile {
    std::string path;
    void *map = nullptr;          /* mmap'd file (read-only) */
    size_t size = 0;              /* bytes mapped */
    std::vector<StTensor> tensors;
};

/* Element size in bytes of a safetensors dtype name, 0 if unknown. */
size_t st_dtype_size(const std::string &dtype);

/* Parses and validates the header of a safetensors image buf[0, size) (used on mapped files and by
 * the fuzzer). `name` prefixes error messages. Tensor data pointers point into buf. */
bool st_parse(const uint8_t *buf, size_t size, const std::string &name,
              std::vector<StTensor> *tensors, std::string *err);

/* mmaps `path` and parses it; on failure *out holds nothing and *err says why. */
bool st_open(const std::string &path, StFile *out, std::string *err);
void st_close(StFile *f);

}  // namespace ats
