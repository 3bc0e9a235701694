/* Thread counts (C API): every ATS call that starts threads accepts at most ats_threads_max()
 * of them, so a mistyped count is a clear error instead of tens of thousands of threads that
 * exhaust the host's process limit. */
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most threads one call may use: ATS_THREADS_PER_CPU x the hardware threads. */
#define ATS_THREADS_PER_CPU 4
int ats_threads_max(void);

/* n_threads checked and resolved: 0 -> the hardware threads, 1..ats_threads_max() as given.
 * Returns -1 with a message naming the value and the limit in err on a negative count or one
 * above the maximum. */
int ats_threads_resolve(int n_threads, char *err, size_t err_cap);

#ifdef __cplusplus
}
#endif
