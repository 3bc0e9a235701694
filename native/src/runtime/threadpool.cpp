/* ThreadPool. A job publishes fn and one claim word (job id, task count, next task); any thread
 * claims a task with a compare-and-swap on that word, so a claim is valid exactly when the word
 * still describes the current job, and the caller only waits for tasks already being run. */
#include "threadpool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "../threads.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() std::this_thread::yield()
#endif

namespace ats {

static const int SPIN_ITERS = 2000;             /* pauses (~10-50 us) before a thread sleeps */
static const int64_t MIN_PARALLEL_WORK = 32768; /* multiply-adds below which threads cost more */
static const uint64_t FIELD = (1u << 20) - 1;   /* 20-bit task count and task index */

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    std::string err;
    if (!threads_start(n_threads_ - 1, [this](int) { worker(); }, &workers_, [this] { stop(); },
                       &err)) {
        throw std::runtime_error(err); /* the started workers are stopped and joined */
    }
}

void ThreadPool::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        generation_.fetch_add(1);
    }
    wake_.notify_all();
}

ThreadPool::~ThreadPool() {
    stop();
    for (std::thread &t : workers_) t.join();
}

void ThreadPool::work_on_job() {
    while (true) {
        uint64_t v = claim_.load(std::memory_order_acquire);
        uint64_t n = (v >> 20) & FIELD, task = v & FIELD;
        if (task >= n) return;
        if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
        (*fn_)((int)task); /* fn_ is the claimed job's: that job cannot end before this task does */
        if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == (int)n) {
            std::lock_guard<std::mutex> lock(done_mutex_);
            done_cv_.notify_one();
        }
    }
}

void ThreadPool::worker() {
    uint64_t seen = 0;
    while (true) {
        for (int spins = 0; generation_.load(std::memory_order_acquire) == seen && spins < SPIN_ITERS;
             spins++) {
            CPU_RELAX();
        }
        if (generation_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_.load() != seen; });
        }
        seen = generation_.load(std::memory_order_acquire);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stop_) return;
        }
        work_on_job();
    }
}

void ThreadPool::run(int n_tasks, const std::function<void(int)> &fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(t);
        return;
    }
    if ((uint64_t)n_tasks > FIELD) { /* more tasks than the claim word counts: run in rounds */
        for (int base = 0; base < n_tasks; base += (int)FIELD) {
            int n = n_tasks - base < (int)FIELD ? n_tasks - base : (int)FIELD;
            run(n, [&](int t) { fn(base + t); });
        }
        return;
    }
    fn_ = &fn;
    done_.store(0, std::memory_order_relaxed);
    job_++;
    claim_.store((job_ << 40) | ((uint64_t)n_tasks << 20), std::memory_order_release);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    work_on_job();
    for (int spins = 0; done_.load(std::memory_order_acquire) != n_tasks && spins < SPIN_ITERS;
         spins++) {
        CPU_RELAX();
    }
    if (done_.load(std::memory_order_acquire) != n_tasks) {
        std::unique_lock<std::mutex> lock(done_mutex_);
        done_cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == n_tasks; });
    }
}

void ThreadPool::run_sized(int n_tasks, int64_t work, const std::function<void(int)> &fn) {
    if (work < MIN_PARALLEL_WORK) {
        for (int t = 0; t < n_tasks; t++) fn(t);
        return;
    }
    run(n_tasks, fn);
}

void ThreadPool::run_rows(int n_rows, int64_t work, const std::function<void(int)> &fn) {
    const int per_task = std::max(1, n_rows / (n_threads_ * 4));
    run_sized((n_rows + per_task - 1) / per_task, work, [&](int t) {
        for (int r = t * per_task; r < std::min(n_rows, (t + 1) * per_task); r++) fn(r);
    });
}

}  // namespace ats
