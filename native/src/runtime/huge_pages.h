/* Buffers that the forward pass streams every step (the repacked weights, the KV cache), backed
 * by transparent huge pages where the OS offers them. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <memory>

namespace ats {

/* Frees aligned_alloc'd memory (huge_alloc's buffers). */
struct FreeDeleter {
    void operator()(uint8_t *p) const { free(p); }
};

using HugeBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

/* An uninitialised buffer of at least `bytes` (> 0): from 2 MiB on aligned to 2 MiB and advised
 * for transparent huge pages on Linux (before the first touch: a page's size is chosen when it
 * faults in), else 64-byte aligned. On 4 KiB pages every 4 KiB streamed costs a page walk, and in
 * a VM a nested one: dense-254m int4 weights span ~30000 pages, ten times what the L2 TLB maps
 * (huge pages made int4 and int8 decode ~10-15% faster), and a decode row's keys and values at
 * 1000 positions span ~16000 (its attention took ~1.6x less CPU on huge pages; both on the
 * 2-core EPYC VM).
 * The advice only changes the page size, so its result is not checked: where it is refused the
 * buffer works the same on small pages. Throws std::bad_alloc. */
HugeBuffer huge_alloc(size_t bytes);

}  // namespace ats
