/* Thread counts inside the core (include/ats/threads.h), and starting a set of std::threads
 * that either all start or none are left running. */
#pragma once
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace ats {

/* 0 -> the hardware threads (at least 1), 1..ats_threads_max() as given; -1 with *err set for a
 * negative count or one above the maximum. `what` names the argument in the message. */
int threads_resolve(int n_threads, const char *what, std::string *err);

/* Starts n threads running fn(t), t = 0..n-1, into *threads. When the system refuses one
 * (std::system_error, e.g. EAGAIN under a process limit), `on_failure()` runs first (it must make
 * the started threads' fn return), every started thread is joined, and false comes back with
 * *err saying how many started. */
bool threads_start(int n, const std::function<void(int)> &fn, std::vector<std::thread> *threads,
                   const std::function<void()> &on_failure, std::string *err);

}  // namespace ats
