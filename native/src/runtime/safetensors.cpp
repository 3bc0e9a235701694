/* safetensors header validation and mmap (format: u64 little-endian header length, JSON header
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, data area). */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "json.h"

namespace ats {

size_t st_dtype_size(const std::string &d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
    return 0;
}

static bool fail(std::string *err, const std::string &name, const std::string &msg) {
    *err = name + ": " + msg;
    return false;
}

bool st_parse(const uint8_t *buf, size_t size, const std::string &name,
              std::vector<StTensor> *tensors, std::string *err) {
    tensors->clear();
    if (size < 8) {
        return fail(err, name,
                    "truncated: " + std::to_string(size) + " bytes, a safetensors file has at least 8");
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | buf[i];
    if (header_len > ST_MAX_HEADER_BYTES || header_len > size - 8) {
        return fail(err, name,
                    "truncated or corrupt: header length field says " + std::to_string(header_len) +
                        " bytes, file has " + std::to_string(size - 8) + " after it");
    }
    JsonValue root;
    std::string jerr;
    if (!json_parse((const char *)buf + 8, (size_t)header_len, &root, &jerr)) {
        return fail(err, name, "corrupt header: " + jerr);
    }
    if (root.type != JSON_OBJECT) return fail(err, name, "corrupt header: expected a JSON object");
    const uint8_t *data = buf + 8 + header_len;
    uint64_t data_size = size - 8 - header_len;
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (size_t i = 0; i < root.keys.size(); i++) {
        const std::string &key = root.keys[i];
        const JsonValue &e = root.items[i];
        if (key == "__metadata__") {
            if (e.type != JSON_OBJECT) return fail(err, name, "__metadata__ is not an object");
            for (const JsonValue &m : e.items) {
                if (m.type != JSON_STRING) return fail(err, name, "__metadata__ values must be strings");
            }
            continue;
        }
        const std::string where = "tensor " + key;
        if (e.type != JSON_OBJECT) return fail(err, name, where + " has a malformed header entry");
        const JsonValue *dtype = e.get("dtype"), *shape = e.get("shape"), *offs = e.get("data_offsets");
        if (!dtype || dtype->type != JSON_STRING) return fail(err, name, where + ": missing dtype string");
        size_t esize = st_dtype_size(dtype->str);
        if (esize == 0) return fail(err, name, where + ": unknown dtype '" + dtype->str + "'");
        if (!shape || shape->type != JSON_ARRAY) return fail(err, name, where + ": missing shape list");
        if (shape->items.size() > 8) return fail(err, name, where + ": more than 8 dimensions");
        if (!offs || offs->type != JSON_ARRAY || offs->items.size() != 2) {
            return fail(err, name, where + ": data_offsets must be [begin, end]");
        }
        StTensor t;
        t.name = key;
        t.dtype = dtype->str;
        uint64_t count = 1;
        bool overflow = false;
        for (const JsonValue &d : shape->items) {
            if (d.type != JSON_NUMBER || !d.is_int || d.integer < 0) {
                return fail(err, name, where + ": shape entries must be non-negative integers");
            }
            uint64_t v = (uint64_t)d.integer;
            if (v != 0 && count > UINT64_MAX / v) overflow = true;
            else count *= v;
            t.shape.push_back(d.integer);
        }
        if (overflow || count > UINT64_MAX / esize) {
            return fail(err, name, where + ": shape is too large (element count overflows)");
        }
        uint64_t nbytes = count * esize;
        for (const JsonValue &o : offs->items) {
            if (o.type != JSON_NUMBER || !o.is_int || o.integer < 0) {
                return fail(err, name, where + ": data_offsets must be non-negative integers");
            }
        }
        uint64_t begin = (uint64_t)offs->items[0].integer, end = (uint64_t)offs->items[1].integer;
        if (begin > end || end > data_size) {
            return fail(err, name,
                        where + ": data_offsets [" + std::to_string(begin) + ", " +
                            std::to_string(end) + "] lie outside the data area of " +
                            std::to_string(data_size) + " bytes (truncated file?)");
        }
        if (end - begin != nbytes) {
            return fail(err, name,
                        where + ": data_offsets span " + std::to_string(end - begin) +
                            " bytes, but dtype " + t.dtype + " and its shape need " +
                            std::to_string(nbytes));
        }
        for (const StTensor &prev : *tensors) {
            if (prev.name == key) return fail(err, name, where + " appears twice");
        }
        t.data = data + begin;
        t.nbytes = (size_t)nbytes;
        spans.push_back({begin, end});
        tensors->push_back(t);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); i++) {
        if (spans[i].first < spans[i - 1].second) {
            return fail(err, name,
                        "tensors overlap: byte " + std::to_string(spans[i].first) +
                            " of the data area belongs to two tensors");
        }
    }
    return true;
}

bool st_open(const std::string &path, StFile *out, std::string *err) {
    *out = StFile();
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) {
        *err = path + ": cannot open: " + strerror(errno);
        return false;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        *err = path + ": not a regular file";
        return false;
    }
    size_t size = (size_t)st.st_size;
    void *map = nullptr;
    if (size > 0) {
        map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            *err = path + ": mmap failed: " + strerror(errno);
            return false;
        }
    }
    close(fd);
    static const uint8_t empty[1] = {0};
    if (!st_parse(map ? (const uint8_t *)map : empty, size, path, &out->tensors, err)) {
        if (map) munmap(map, size);
        out->tensors.clear();
        return false;
    }
    out->path = path;
    out->map = map;
    out->size = size;
    return true;
}

void st_close(StFile *f) {
    if (f->map) munmap(f->map, f->size);
    f->map = nullptr;
    f->size = 0;
    f->tensors.clear();
}

}  // namespace ats
