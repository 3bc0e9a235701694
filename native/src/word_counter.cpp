/* Word counts for training: each thread counts the pre-tokens of its texts in a local map keyed by
 * views into the texts, then the local maps are summed into the counter's owned map. Calls on one
 * counter are serialized by its mutex (the Python bindings release the GIL around them). */
#include "ats/word_counter.h"

#include <stdio.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "threads.h"

struct ats_word_counter {
    mutable std::mutex mu;
    ats_pattern pattern;
    std::unordered_map<std::string, int64_t> counts;
};

ats_word_counter *ats_word_counter_init(ats_pattern pattern) {
    ats_word_counter *wc = new ats_word_counter();
    wc->pattern = pattern;
    return wc;
}

void ats_word_counter_free(ats_word_counter *wc) { delete wc; }

int ats_word_counter_add(ats_word_counter *wc, const char *const *texts, const size_t *lens,
                         size_t n, int n_threads, char *err, size_t err_cap) {
    std::string msg;
    int resolved = ats::threads_resolve(n_threads, "threads", &msg);
    if (resolved < 0) {
        snprintf(err, err_cap, "%s", msg.c_str());
        return -1;
    }
    size_t workers = (size_t)resolved;
    if (workers > n) workers = n;
    if (workers == 0) return 0;
    std::vector<std::unordered_map<std::string_view, int64_t>> local(workers);
    std::atomic<size_t> next_item(0);
    ats_pattern pattern = wc->pattern;
    auto work = [&](size_t t) {
        std::unordered_map<std::string_view, int64_t> &counts = local[t];
        for (size_t i = next_item.fetch_add(1); i < n; i = next_item.fetch_add(1)) {
            const char *s = texts[i];
            for (size_t pos = 0; pos < lens[i];) {
                size_t end = ats_pretokenize_next(pattern, s, lens[i], pos);
                counts[std::string_view(s + pos, end - pos)] += 1;
                pos = end;
            }
        }
    };
    std::vector<std::thread> pool;
    /* thread t + 1 of the pool counts into local[t + 1]; on a refused thread the started ones
     * finish the queue and nothing is added */
    if (workers > 1 &&
        !ats::threads_start((int)workers - 1, [&](int t) { work((size_t)t + 1); }, &pool, [] {}, &msg)) {
        snprintf(err, err_cap, "%s", msg.c_str());
        return -1;
    }
    work(0);
    for (size_t t = 0; t < pool.size(); t++) pool[t].join();
    std::lock_guard<std::mutex> lock(wc->mu);
    for (size_t t = 0; t < workers; t++) {
        for (const auto &kv : local[t]) wc->counts[std::string(kv.first)] += kv.second;
    }
    return 0;
}

void ats_word_counter_insert(ats_word_counter *wc, const char *word, size_t len, int64_t count) {
    std::lock_guard<std::mutex> lock(wc->mu);
    wc->counts[std::string(word, len)] += count;
}

void ats_word_counter_prune(ats_word_counter *wc, size_t max_words) {
    std::lock_guard<std::mutex> lock(wc->mu);
    if (wc->counts.size() <= max_words) return;
    /* With counts sorted descending, at most max_words words have count > t exactly when
     * t >= sorted[max_words]; the smallest such t >= 1 is the cut. */
    std::vector<int64_t> sorted;
    sorted.reserve(wc->counts.size());
    for (const auto &kv : wc->counts) sorted.push_back(kv.second);
    std::nth_element(sorted.begin(), sorted.begin() + max_words, sorted.end(),
                     std::greater<int64_t>());
    int64_t t = std::max<int64_t>(1, sorted[max_words]);
    for (auto it = wc->counts.begin(); it != wc->counts.end();) {
        if (it->second <= t) {
            it = wc->counts.erase(it);
        } else {
            ++it;
        }
    }
}

size_t ats_word_counter_size(const ats_word_counter *wc) {
    std::lock_guard<std::mutex> lock(wc->mu);
    return wc->counts.size();
}

void ats_word_counter_foreach(const ats_word_counter *wc, ats_word_visit_fn fn, void *ctx) {
    std::lock_guard<std::mutex> lock(wc->mu);
    for (const auto &kv : wc->counts) fn(ctx, kv.first.data(), kv.first.size(), kv.second);
}
