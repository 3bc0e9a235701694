/* A fixed pool of worker threads for data-parallel loops: run(n_tasks, fn) calls fn(task) for
 * every task once, spread over the workers and the calling thread, and returns when all are done.
 * Tasks are claimed from one atomic word, so the caller never waits for a worker that is not
 * running (on a busy CPU it simply does the tasks itself); threads spin briefly before sleeping, so
 * back-to-back decode kernels rarely pay a wake-up. */
#pragma once
#include <stdint.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ats {

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads); /* total threads including the caller; >= 1 */
    ~ThreadPool();
    int size() const { return n_threads_; }
    void run(int n_tasks, const std::function<void(int)> &fn);
    /* run() when `work` (a rough count of multiply-adds) is worth waking threads, else inline */
    void run_sized(int n_tasks, int64_t work, const std::function<void(int)> &fn);

  private:
    void worker();
    void work_on_job();
    int n_threads_;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::mutex done_mutex_;
    std::condition_variable done_cv_;
    std::atomic<uint64_t> generation_{0}; /* bumped per job: wakes the workers */
    std::atomic<uint64_t> claim_{0};      /* job << 40 | n_tasks << 20 | next task */
    std::atomic<int> done_{0};            /* tasks of the current job finished */
    const std::function<void(int)> *fn_ = nullptr;
    uint64_t job_ = 0;
    bool stop_ = false;
};

}  // namespace ats
