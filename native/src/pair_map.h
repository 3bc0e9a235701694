/* Open-addressing hash map from a token pair (left, right), packed into 64 bits, to a 64-bit value.
 * Linear probing, power-of-two capacity, load <= 1/2, no deletion (its users never delete). Used by
 * the BPE encoder (pair -> rank and merged id) and the trainer (pair -> pair index). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <vector>

static const uint64_t PAIR_MAP_EMPTY = ~(uint64_t)0; /* (-1, -1) is never a valid pair */

struct PairSlot {
    uint64_t key;
    int64_t value;
};

struct PairMap {
    std::vector<PairSlot> slots; /* capacity is a power of two */
    size_t size;                 /* occupied slots */
    uint64_t mask;               /* capacity - 1 */
};

static inline uint64_t pair_key(int32_t left, int32_t right) {
    return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}

static inline int32_t pair_left(uint64_t key) { return (int32_t)(key >> 32); }
static inline int32_t pair_right(uint64_t key) { return (int32_t)(key & 0xFFFFFFFFu); }

/* splitmix64 finalizer: packed pairs differ in few bits, so mix before masking */
static inline uint64_t pair_hash(uint64_t key) {
    key ^= key >> 30;
    key *= 0xBF58476D1CE4E5B9ull;
    key ^= key >> 27;
    key *= 0x94D049BB133111EBull;
    key ^= key >> 31;
    return key;
}

static inline void pair_map_init(PairMap *map, size_t expected) {
    size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    map->slots.assign(cap, PairSlot{PAIR_MAP_EMPTY, 0});
    map->size = 0;
    map->mask = cap - 1;
}

/* Pointer to the value of key, or NULL when absent. */
static inline int64_t *pair_map_find(PairMap *map, uint64_t key) {
    uint64_t i = pair_hash(key) & map->mask;
    for (;;) {
        PairSlot *slot = &map->slots[i];
        if (slot->key == key) return &slot->value;
        if (slot->key == PAIR_MAP_EMPTY) return NULL;
        i = (i + 1) & map->mask;
    }
}

static inline const int64_t *pair_map_get(const PairMap *map, uint64_t key) {
    return pair_map_find(const_cast<PairMap *>(map), key);
}

static inline void pair_map_grow(PairMap *map) {
    std::vector<PairSlot> old;
    old.swap(map->slots);
    pair_map_init(map, old.size());
    for (size_t i = 0; i < old.size(); i++) {
        if (old[i].key == PAIR_MAP_EMPTY) continue;
        uint64_t j = pair_hash(old[i].key) & map->mask;
        while (map->slots[j].key != PAIR_MAP_EMPTY) j = (j + 1) & map->mask;
        map->slots[j] = old[i];
        map->size++;
    }
}

/* Pointer to the value of key, inserting it with `initial` when absent (*inserted says which).
 * Pointers are invalidated by the next insertion. */
static inline int64_t *pair_map_upsert(PairMap *map, uint64_t key, int64_t initial, int *inserted) {
    if (2 * (map->size + 1) > map->slots.size()) pair_map_grow(map);
    uint64_t i = pair_hash(key) & map->mask;
    for (;;) {
        PairSlot *slot = &map->slots[i];
        if (slot->key == key) {
            *inserted = 0;
            return &slot->value;
        }
        if (slot->key == PAIR_MAP_EMPTY) {
            slot->key = key;
            slot->value = initial;
            map->size++;
            *inserted = 1;
            return &slot->value;
        }
        i = (i + 1) & map->mask;
    }
}
