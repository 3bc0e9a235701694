// A Python int thread count as the C API's int: values inside int's range go to the core, which
// checks 0..ats_threads_max() (ats/threads.h) and names the value; values past int's range get
// the same message here instead of nanobind's TypeError.
#pragma once
#include <nanobind/nanobind.h>
#include <stdint.h>

#include <string>

#include "ats/threads.h"

inline int thread_count_arg(int64_t threads) {
    if (threads < INT32_MIN || threads > INT32_MAX) {
        throw nanobind::value_error(("threads = " + std::to_string(threads) +
                                     ": expected 0 (all hardware threads) to " +
                                     std::to_string(ats_threads_max()))
                                        .c_str());
    }
    return (int)threads;
}
