/* huge_alloc (huge_pages.h). */
#include "huge_pages.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <new>

namespace ats {

static const size_t HUGE_PAGE = (size_t)2 << 20;

HugeBuffer huge_alloc(size_t bytes) {
    const size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : 64;
    const size_t size = (bytes + align - 1) / align * align;
    uint8_t *buf = (uint8_t *)aligned_alloc(align, size);
    if (!buf) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == HUGE_PAGE) madvise(buf, size, MADV_HUGEPAGE);
#endif
    return HugeBuffer(buf);
}

}  // namespace ats
