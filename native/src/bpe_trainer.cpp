/* Incremental BPE training (as HF `tokenizers`' BpeTrainer): pair counts, pair -> words holding it
 * (lists with stale entries allowed), a max-heap of (count, pair) with lazy invalidation. Counts of
 * old pairs only fall after they are pushed, so a popped entry whose count is current is the best
 * pair; a stale one is pushed back with its current count. */
#include "ats/bpe_trainer.h"

#include <algorithm>
#include <queue>
#include <vector>

#include "pair_map.h"

struct HeapEntry {
    int64_t count;
    uint64_t key; /* pair_key(left, right): comparing keys compares (left, right) */
};

/* max-heap order: higher count first, then the smaller (left, right) */
struct HeapLess {
    bool operator()(const HeapEntry &a, const HeapEntry &b) const {
        if (a.count != b.count) return a.count < b.count;
        return a.key > b.key;
    }
};

struct Corpus {
    std::vector<int32_t> ids;    /* every word's tokens, word after word */
    std::vector<size_t> start;   /* first token of word w in ids */
    std::vector<uint32_t> len;   /* tokens of word w (shrinks as merges apply) */
    std::vector<int64_t> count;  /* occurrences of word w */
};

struct Pairs {
    PairMap index;                          /* pair_key -> pair index */
    std::vector<uint64_t> key;              /* per pair index */
    std::vector<int64_t> count;             /* total count over words */
    std::vector<std::vector<int32_t>> where; /* words that held the pair when it was counted */
    std::vector<int32_t> touched_step;      /* last merge step that raised the count */
};

static void collect_word(void *ctx, const char *word, size_t n, int64_t count) {
    Corpus *c = (Corpus *)ctx;
    c->start.push_back(c->ids.size());
    c->len.push_back((uint32_t)n);
    c->count.push_back(count);
    for (size_t i = 0; i < n; i++) c->ids.push_back((unsigned char)word[i]);
}

static size_t pair_index(Pairs *p, uint64_t key) {
    int inserted;
    int64_t *v = pair_map_upsert(&p->index, key, (int64_t)p->key.size(), &inserted);
    if (inserted) {
        p->key.push_back(key);
        p->count.push_back(0);
        p->where.emplace_back();
        p->touched_step.push_back(-1);
    }
    return (size_t)*v;
}

/* Adds delta * (one occurrence) of (left, right) in word w; raised pairs are listed in `raised`. */
static void change(Pairs *p, int32_t left, int32_t right, int64_t delta, int32_t w, int32_t step,
                   std::vector<size_t> *raised) {
    size_t i = pair_index(p, pair_key(left, right));
    p->count[i] += delta;
    if (delta > 0) {
        std::vector<int32_t> &where = p->where[i];
        if (where.empty() || where.back() != w) where.push_back(w);
        if (p->touched_step[i] != step) {
            p->touched_step[i] = step;
            raised->push_back(i);
        }
    }
}

/* Replaces (a, b) by m in word w, left to right without overlap, updating the pair counts: each
 * replaced occurrence removes (prev, a), (a, b), (b, next) and adds (prev, m), (m, next), where prev
 * is the already rewritten token (so "a b a b" ends with (m, m), not (m, a)). */
static void merge_word(Corpus *c, Pairs *p, int32_t w, int32_t a, int32_t b, int32_t m,
                       int32_t step, std::vector<size_t> *raised) {
    int32_t *ids = c->ids.data() + c->start[w];
    size_t n = c->len[w];
    int64_t cnt = c->count[w];
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + 1 < n && ids[i] == a && ids[i + 1] == b) {
            if (k > 0) {
                change(p, ids[k - 1], a, -cnt, w, step, raised);
                change(p, ids[k - 1], m, cnt, w, step, raised);
            }
            if (i + 2 < n) {
                change(p, b, ids[i + 2], -cnt, w, step, raised);
                change(p, m, ids[i + 2], cnt, w, step, raised);
            }
            change(p, a, b, -cnt, w, step, raised);
            ids[k++] = m;
            i += 2;
        } else {
            ids[k++] = ids[i++];
        }
    }
    c->len[w] = (uint32_t)k;
}

size_t ats_bpe_train(const ats_word_counter *wc, const ats_bpe_train_params *params,
                     int32_t *merges_out) {
    Corpus c;
    ats_word_counter_foreach(wc, collect_word, &c);
    Pairs p;
    pair_map_init(&p.index, 1 << 16);
    std::vector<size_t> raised;
    for (size_t w = 0; w < c.start.size(); w++) {
        const int32_t *ids = c.ids.data() + c.start[w];
        for (size_t i = 0; i + 1 < c.len[w]; i++) {
            change(&p, ids[i], ids[i + 1], c.count[w], (int32_t)w, 0, &raised);
        }
    }
    std::vector<HeapEntry> entries;
    entries.reserve(p.key.size());
    for (size_t i = 0; i < p.key.size(); i++) entries.push_back(HeapEntry{p.count[i], p.key[i]});
    std::priority_queue<HeapEntry, std::vector<HeapEntry>, HeapLess> heap(HeapLess(),
                                                                          std::move(entries));
    size_t done = 0;
    while (done < params->n_merges && !heap.empty()) {
        HeapEntry top = heap.top();
        heap.pop();
        size_t i = (size_t)*pair_map_get(&p.index, top.key);
        int64_t current = p.count[i];
        if (current != top.count) {
            if (current > 0) heap.push(HeapEntry{current, top.key});
            continue;
        }
        if (current < params->min_frequency || current <= 0) break;
        int32_t a = pair_left(top.key), b = pair_right(top.key);
        int32_t m = (int32_t)(256 + done);
        int32_t step = (int32_t)(done + 1);
        std::vector<int32_t> words;
        words.swap(p.where[i]);
        raised.clear();
        for (size_t k = 0; k < words.size(); k++) merge_word(&c, &p, words[k], a, b, m, step, &raised);
        for (size_t k = 0; k < raised.size(); k++) {
            size_t r = raised[k];
            if (p.count[r] > 0) heap.push(HeapEntry{p.count[r], p.key[r]});
        }
        merges_out[2 * done] = a;
        merges_out[2 * done + 1] = b;
        done++;
    }
    return done;
}
