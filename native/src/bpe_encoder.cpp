/* BPE encoder: validation of (byte_ids, merges), the per-pre-token merge loop (a linear scan for
 * short pre-tokens, a heap over a linked list for long ones so a 1 MB run stays n log n), and the
 * threaded batch. */
#include "ats/bpe_encoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <functional>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "pair_map.h"
#include "threads.h"

/* A merge is stored as rank << 32 | merged id: the minimum over a pre-token is the lowest rank,
 * and equal values are the same pair, so the first minimum is the leftmost occurrence. */
static const int64_t NO_MERGE = INT64_MAX;
static const size_t LONG_PIECE = 256; /* bytes; longer pre-tokens use the heap merge */

struct ats_bpe_encoder {
    ats_pattern pattern;
    int32_t byte_ids[256];
    PairMap merges; /* pair_key(left, right) -> rank << 32 | merged id */
};

/* Direct-mapped cache of short pre-tokens -> ids, one per encoding thread: text repeats a few
 * thousand pre-tokens, and a hit skips the merge loop. The key is the zero-padded bytes. */
static const size_t CACHE_SLOTS = 4096;     /* power of two */
static const size_t CACHE_MAX_BYTES = 16;   /* longer pre-tokens are not cached */
static const size_t CACHE_MIN_TEXT = 65536; /* bytes; less text than this skips the cache */

struct CacheSlot {
    uint64_t key[2];                  /* the pre-token's bytes, zero-padded */
    uint32_t n_bytes;                 /* 0: empty slot */
    uint32_t n_ids;                   /* ids used */
    int32_t ids[CACHE_MAX_BYTES];     /* the pre-token's ids */
};

/* Scratch buffers of one encoding thread. */
struct EncodeScratch {
    std::vector<int32_t> ids;
    std::vector<int64_t> vals;
    std::vector<int64_t> prev;
    std::vector<int64_t> next;
    std::vector<CacheSlot> cache; /* empty: caching off */
};

void ats_ids_free(ats_ids *ids) {
    free(ids->data);
    ids->data = NULL;
    ids->len = 0;
    ids->cap = 0;
}

static void ids_append(ats_ids *out, const int32_t *ids, size_t n) {
    if (out->len + n > out->cap) {
        size_t cap = out->cap ? out->cap : 64;
        while (cap < out->len + n) cap *= 2;
        int32_t *data = (int32_t *)realloc(out->data, cap * sizeof(int32_t));
        if (!data) abort(); /* out of memory: nothing sensible to return to */
        out->data = data;
        out->cap = cap;
    }
    memcpy(out->data + out->len, ids, n * sizeof(int32_t));
    out->len += n;
}

static inline int64_t merge_of(const ats_bpe_encoder *enc, int32_t left, int32_t right) {
    const int64_t *v = pair_map_get(&enc->merges, pair_key(left, right));
    return v ? *v : NO_MERGE;
}

/* Quadratic merge loop (as tiktoken's): fine for short pre-tokens, cache-friendly. */
static void merge_short(const ats_bpe_encoder *enc, EncodeScratch *sc) {
    int32_t *ids = sc->ids.data();
    size_t m = sc->ids.size();
    sc->vals.resize(m);
    int64_t *vals = sc->vals.data();
    for (size_t i = 0; i + 1 < m; i++) vals[i] = merge_of(enc, ids[i], ids[i + 1]);
    while (m > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < m; i++) {
            if (vals[i] < vals[best]) best = i;
        }
        if (vals[best] == NO_MERGE) break;
        ids[best] = (int32_t)(vals[best] & 0xFFFFFFFF);
        memmove(ids + best + 1, ids + best + 2, (m - best - 2) * sizeof(int32_t));
        memmove(vals + best, vals + best + 1, (m - best - 2) * sizeof(int64_t));
        m--;
        if (best + 1 < m) vals[best] = merge_of(enc, ids[best], ids[best + 1]);
        if (best > 0) vals[best - 1] = merge_of(enc, ids[best - 1], ids[best]);
    }
    sc->ids.resize(m);
}

/* Heap of (merge value, left position) over a doubly linked list of tokens; stale entries are
 * skipped when popped. Same order as merge_short: lowest rank, then leftmost. */
static void merge_long(const ats_bpe_encoder *enc, EncodeScratch *sc) {
    typedef std::pair<int64_t, int64_t> Entry;
    std::vector<int32_t> &ids = sc->ids;
    int64_t m = (int64_t)ids.size();
    sc->prev.resize(m);
    sc->next.resize(m);
    int64_t *prev = sc->prev.data();
    int64_t *next = sc->next.data();
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (int64_t i = 0; i < m; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < m ? i + 1 : -1;
        if (i + 1 < m) {
            int64_t v = merge_of(enc, ids[i], ids[i + 1]);
            if (v != NO_MERGE) heap.push(Entry(v, i));
        }
    }
    while (!heap.empty()) {
        Entry top = heap.top();
        heap.pop();
        int64_t i = top.second;
        /* a removed node has prev == -2; node 0 is never removed */
        if (prev[i] == -2 || next[i] == -1) continue;
        if (merge_of(enc, ids[i], ids[next[i]]) != top.first) continue;
        int64_t j = next[i];
        ids[i] = (int32_t)(top.first & 0xFFFFFFFF);
        prev[j] = -2;
        next[i] = next[j];
        if (next[j] != -1) prev[next[j]] = i;
        if (prev[i] >= 0) {
            int64_t v = merge_of(enc, ids[prev[i]], ids[i]);
            if (v != NO_MERGE) heap.push(Entry(v, prev[i]));
        }
        if (next[i] != -1) {
            int64_t v = merge_of(enc, ids[i], ids[next[i]]);
            if (v != NO_MERGE) heap.push(Entry(v, i));
        }
    }
    int64_t k = 0;
    for (int64_t i = 0; i != -1; i = next[i]) ids[k++] = ids[i];
    ids.resize(k);
}

static void encode_piece(const ats_bpe_encoder *enc, const unsigned char *s, size_t n,
                         EncodeScratch *sc, ats_ids *out) {
    if (n == 1) {
        ids_append(out, &enc->byte_ids[s[0]], 1);
        return;
    }
    CacheSlot *slot = NULL;
    uint64_t key[2] = {0, 0};
    if (n <= CACHE_MAX_BYTES && !sc->cache.empty()) {
        memcpy(key, s, n);
        uint64_t h = pair_hash(key[0] ^ pair_hash(key[1] ^ n));
        slot = &sc->cache[h & (CACHE_SLOTS - 1)];
        if (slot->n_bytes == n && slot->key[0] == key[0] && slot->key[1] == key[1]) {
            ids_append(out, slot->ids, slot->n_ids);
            return;
        }
    }
    sc->ids.resize(n);
    for (size_t i = 0; i < n; i++) sc->ids[i] = enc->byte_ids[s[i]];
    if (n <= LONG_PIECE) {
        merge_short(enc, sc);
    } else {
        merge_long(enc, sc);
    }
    ids_append(out, sc->ids.data(), sc->ids.size());
    if (slot) {
        slot->key[0] = key[0];
        slot->key[1] = key[1];
        slot->n_bytes = (uint32_t)n;
        slot->n_ids = (uint32_t)sc->ids.size();
        memcpy(slot->ids, sc->ids.data(), sc->ids.size() * sizeof(int32_t));
    }
}

static void encode_text(const ats_bpe_encoder *enc, const char *text, size_t len,
                        EncodeScratch *sc, ats_ids *out) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t pos = 0; pos < len;) {
        size_t end = ats_pretokenize_next(enc->pattern, text, len, pos);
        encode_piece(enc, s + pos, end - pos, sc, out);
        pos = end;
    }
}

ats_bpe_encoder *ats_bpe_encoder_init(const ats_bpe_encoder_params *params, char *err,
                                      size_t err_cap) {
    ats_bpe_encoder *enc = new ats_bpe_encoder();
    enc->pattern = params->pattern;
    /* role of each id: 1 byte token, 2 merged token */
    PairMap roles;
    pair_map_init(&roles, 256 + params->n_merges);
    int inserted;
    for (int b = 0; b < 256; b++) {
        int32_t id = params->byte_ids[b];
        if (id < 0) {
            snprintf(err, err_cap, "byte_ids[%d] = %d is negative", b, (int)id);
            delete enc;
            return NULL;
        }
        pair_map_upsert(&roles, (uint64_t)id, 1, &inserted);
        if (!inserted) {
            snprintf(err, err_cap, "byte_ids[%d] = %d repeats an earlier byte id", b, (int)id);
            delete enc;
            return NULL;
        }
        enc->byte_ids[b] = id;
    }
    const int32_t *rows = params->merges;
    pair_map_init(&enc->merges, params->n_merges);
    for (size_t r = 0; r < params->n_merges; r++) {
        int32_t left = rows[3 * r], right = rows[3 * r + 1], merged = rows[3 * r + 2];
        /* as the reference: parts are byte ids or ids made by an earlier merge */
        if (left < 0 || right < 0 || !pair_map_get(&roles, (uint64_t)left) ||
            !pair_map_get(&roles, (uint64_t)right)) {
            snprintf(err, err_cap,
                     "merges[%zu] = (%d, %d, %d) uses an id that is neither a byte id nor the "
                     "result of an earlier merge",
                     r, (int)left, (int)right, (int)merged);
            delete enc;
            return NULL;
        }
        if (merged < 0) {
            snprintf(err, err_cap, "merges[%zu] has a negative merged id %d", r, (int)merged);
            delete enc;
            return NULL;
        }
        pair_map_upsert(&roles, (uint64_t)merged, 2, &inserted);
        if (!inserted) {
            snprintf(err, err_cap, "merges[%zu] merged id %d is already a byte or merged id", r,
                     (int)merged);
            delete enc;
            return NULL;
        }
        pair_map_upsert(&enc->merges, pair_key(left, right), ((int64_t)r << 32) | (uint32_t)merged,
                        &inserted);
        if (!inserted) {
            snprintf(err, err_cap, "merges[%zu] repeats the pair (%d, %d) of an earlier merge", r,
                     (int)left, (int)right);
            delete enc;
            return NULL;
        }
    }
    return enc;
}

void ats_bpe_encoder_free(ats_bpe_encoder *enc) { delete enc; }

void ats_bpe_encoder_encode(const ats_bpe_encoder *enc, const char *text, size_t len,
                            ats_ids *out) {
    EncodeScratch sc;
    if (len >= CACHE_MIN_TEXT) sc.cache.resize(CACHE_SLOTS, CacheSlot());
    encode_text(enc, text, len, &sc, out);
}

int ats_bpe_encoder_encode_batch(const ats_bpe_encoder *enc, const char *const *texts,
                                 const size_t *lens, size_t n, int n_threads, ats_ids *outs,
                                 char *err, size_t err_cap) {
    std::string msg;
    int resolved = ats::threads_resolve(n_threads, "threads", &msg);
    if (resolved < 0) {
        snprintf(err, err_cap, "%s", msg.c_str());
        return -1;
    }
    size_t workers = (size_t)resolved;
    if (workers > n) workers = n;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += lens[i];
    std::atomic<size_t> next_item(0);
    auto work = [&]() {
        EncodeScratch sc;
        if (total >= CACHE_MIN_TEXT) sc.cache.resize(CACHE_SLOTS, CacheSlot());
        for (size_t i = next_item.fetch_add(1); i < n; i = next_item.fetch_add(1)) {
            encode_text(enc, texts[i], lens[i], &sc, &outs[i]);
        }
    };
    std::vector<std::thread> pool;
    /* on a refused thread the started ones finish the queue: nothing to stop */
    if (workers > 1 && !ats::threads_start((int)workers - 1, [&](int) { work(); }, &pool, [] {}, &msg)) {
        snprintf(err, err_cap, "%s", msg.c_str());
        return -1;
    }
    work();
    for (size_t t = 0; t < pool.size(); t++) pool[t].join();
    return 0;
}
