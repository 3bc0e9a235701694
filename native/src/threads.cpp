/* Thread counts and all-or-nothing thread start (threads.h). */
#include "threads.h"

#include <system_error>

#include "ats/threads.h"

namespace ats {

static int hardware_threads() {
    unsigned n = std::thread::hardware_concurrency();
    return n < 1 ? 1 : (int)n;
}

int threads_resolve(int n_threads, const char *what, std::string *err) {
    const int max = ats_threads_max();
    if (n_threads < 0 || n_threads > max) {
        *err = std::string(what) + " = " + std::to_string(n_threads) + ": expected 0 (all " +
               std::to_string(hardware_threads()) + " hardware threads) to " +
               std::to_string(max) + " (" + std::to_string(ATS_THREADS_PER_CPU) +
               " per hardware thread)";
        return -1;
    }
    return n_threads == 0 ? hardware_threads() : n_threads;
}

bool threads_start(int n, const std::function<void(int)> &fn, std::vector<std::thread> *threads,
                   const std::function<void()> &on_failure, std::string *err) {
    threads->reserve((size_t)n);
    for (int t = 0; t < n; t++) {
        try {
            threads->emplace_back(fn, t);
        } catch (const std::system_error &e) {
            on_failure();
            for (std::thread &th : *threads) th.join();
            threads->clear();
            *err = "could not start thread " + std::to_string(t + 1) + " of " + std::to_string(n) +
                   " (" + e.what() + "): the process or user thread limit is reached; use fewer threads";
            return false;
        }
    }
    return true;
}

}  // namespace ats

extern "C" int ats_threads_max(void) { return ATS_THREADS_PER_CPU * ats::hardware_threads(); }

extern "C" int ats_threads_resolve(int n_threads, char *err, size_t err_cap) {
    std::string msg;
    int n = ats::threads_resolve(n_threads, "n_threads", &msg);
    if (n < 0 && err && err_cap > 0) {
        size_t len = msg.size() < err_cap - 1 ? msg.size() : err_cap - 1;
        msg.copy(err, len);
        err[len] = '\0';
    }
    return n;
}
