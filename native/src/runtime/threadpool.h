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
    /* n_threads: total threads including the caller, >= 1 (callers check the count against
     * ats_threads_max first). Throws std::runtime_error saying so when the system refuses a
     * thread; the workers already started are stopped and joined first. */
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    int size() const { return n_threads_; }
    void run(int n_tasks, const std::function<void(int)> &fn);
    /* run() when `work` (a rough count of multiply-adds) is worth waking threads, else inline */
    void run_sized(int n_tasks, int64_t work, const std::function<void(int)> &fn);
    /* run_sized over n_rows rows of equal cost, fn(row) for each: a task is a run of consecutive
     * rows (about 4 tasks per thread), not one row, since each task's claim and completion move
     * two cache lines between the cores (a 128-token dense-254m prefill's per-row jobs made
     * ~10000 tasks; as runs of rows the prefill ran ~1% faster) */
    void run_rows(int n_rows, int64_t work, const std::function<void(int)> &fn);

  private:
    void worker();
    void stop(); /* makes every worker return from worker() */
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
