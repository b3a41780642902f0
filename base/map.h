/* SPDX-License-Identifier: Apache-2.0 */
/* map.h: the one open-addressing hash map of expseg, u64 key -> u64 value, header-only so
 * every layer can use it (pools/ptrmap.c: pointer -> block on the hit path; vmm/fault.c:
 * chunk handle -> size; bench/replay/trace.c: addresses and stream handles -> ids).
 *
 * Slots hold key and value side by side (one cache line per probe); linear probing;
 * Fibonacci hashing (key times 2^64/phi, the top log2(cap) bits), so keys that differ only
 * in high bits or are multiples of a large power of two (aligned addresses) spread; at most
 * half full; deletion by backward shift (no tombstones: every probe chain stays unbroken
 * and short). Key 0 marks an empty slot, so the key 0 itself lives beside the table
 * (has_zero, zero_val). A zeroed map is an empty one. Not thread-safe. put, get and take are inline: the hit path's
 * malloc and free each do one; growth is out of line. */
#ifndef EXPSEG_BASE_MAP_H
#define EXPSEG_BASE_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct _expseg_map_slot_s {
  uint64_t key; /* 0: empty */
  uint64_t val;
} _expseg_map_slot_t;

typedef struct _expseg_map_s {
  _expseg_map_slot_t *slots;
  size_t cap;     /* a power of two >= 16, or 0 before the first put */
  size_t count;   /* keys held, the key 0 included */
  unsigned shift; /* 64 - log2(cap) */
  bool has_zero;
  uint64_t zero_val;
} _expseg_map_t;

#if defined(__GNUC__)
#define EXPSEG_BASE_COLD __attribute__((noinline, cold, unused))
#else
#define EXPSEG_BASE_COLD
#endif

static inline size_t _expseg_map_home(const _expseg_map_t *m, uint64_t key) {
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> m->shift);
}

/* An empty map with room for min_keys keys before it grows (0: allocate on first put).
 * false: no host memory (the map is left empty and usable). */
static inline bool _expseg_map_init(_expseg_map_t *m, size_t min_keys) {
  m->slots = NULL;
  m->cap = m->count = 0;
  m->shift = 64;
  m->has_zero = false;
  m->zero_val = 0;
  if (min_keys == 0) return true;
  size_t cap = 16;
  unsigned bits = 4;
  while (cap < 2 * min_keys && bits < 62) cap <<= 1, bits++;
  m->slots = (_expseg_map_slot_t *)calloc(cap, sizeof *m->slots);
  if (m->slots == NULL) return false;
  m->cap = cap;
  m->shift = 64 - bits;
  return true;
}

static inline void _expseg_map_free(_expseg_map_t *m) {
  free(m->slots);
  _expseg_map_init(m, 0);
}

static inline size_t _expseg_map_count(const _expseg_map_t *m) { return m->count; }

/* Doubles the table (16 slots first). false: no host memory, the map unchanged. */
static EXPSEG_BASE_COLD bool _expseg_map_grow(_expseg_map_t *m) {
  const size_t cap = m->cap ? m->cap * 2 : 16;
  const unsigned shift = m->cap ? m->shift - 1 : 60;
  if (cap < m->cap) return false;
  _expseg_map_slot_t *n = (_expseg_map_slot_t *)calloc(cap, sizeof *n);
  if (n == NULL) return false;
  for (size_t i = 0; i < m->cap; i++) {
    const uint64_t k = m->slots[i].key;
    if (k == 0) continue;
    size_t j = (size_t)((k * 0x9E3779B97F4A7C15ull) >> shift);
    while (n[j].key != 0) j = (j + 1) & (cap - 1);
    n[j] = m->slots[i];
  }
  free(m->slots);
  m->slots = n;
  m->cap = cap;
  m->shift = shift;
  return true;
}

/* The value of key, or NULL. The pointer stays valid until the next put or take. */
static inline uint64_t *_expseg_map_get(const _expseg_map_t *m, uint64_t key) {
  if (key == 0) return m->has_zero ? (uint64_t *)&m->zero_val : NULL;
  if (m->cap == 0) return NULL;
  for (size_t i = _expseg_map_home(m, key);; i = (i + 1) & (m->cap - 1)) {
    if (m->slots[i].key == key) return &m->slots[i].val;
    if (m->slots[i].key == 0) return NULL;
  }
}

/* Sets key's value (adding the key if new). false: no host memory, the map unchanged. */
static inline bool _expseg_map_put(_expseg_map_t *m, uint64_t key, uint64_t val) {
  if (key == 0) {
    m->count += !m->has_zero;
    m->has_zero = true;
    m->zero_val = val;
    return true;
  }
  if ((m->count + 1) * 2 > m->cap && !_expseg_map_grow(m)) return false;
  size_t i = _expseg_map_home(m, key);
  while (m->slots[i].key != 0 && m->slots[i].key != key) i = (i + 1) & (m->cap - 1);
  m->count += m->slots[i].key == 0;
  m->slots[i].key = key;
  m->slots[i].val = val;
  return true;
}

/* Removes key; true (and its value in *val when val is not NULL) when it was there. */
static inline bool _expseg_map_take(_expseg_map_t *m, uint64_t key, uint64_t *val) {
  if (key == 0) {
    if (!m->has_zero) return false;
    if (val != NULL) *val = m->zero_val;
    m->has_zero = false;
    m->count--;
    return true;
  }
  if (m->cap == 0) return false;
  const size_t mask = m->cap - 1;
  size_t i = _expseg_map_home(m, key);
  while (m->slots[i].key != key) {
    if (m->slots[i].key == 0) return false;
    i = (i + 1) & mask;
  }
  if (val != NULL) *val = m->slots[i].val;
  /* backward shift: a later entry of the chain moves into the hole unless its home lies
   * cyclically in (hole, j], where it would no longer be found */
  for (size_t j = (i + 1) & mask; m->slots[j].key != 0; j = (j + 1) & mask) {
    const size_t home = _expseg_map_home(m, m->slots[j].key);
    const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    m->slots[i] = m->slots[j];
    i = j;
  }
  m->slots[i].key = 0;
  m->count--;
  return true;
}

/* Writes every key into out (room for _expseg_map_count keys), in no particular order;
 * returns how many. */
static inline size_t _expseg_map_keys(const _expseg_map_t *m, uint64_t *out) {
  size_t n = 0;
  if (m->has_zero) out[n++] = 0;
  for (size_t i = 0; i < m->cap; i++)
    if (m->slots[i].key != 0) out[n++] = m->slots[i].key;
  return n;
}

#ifdef __cplusplus
}
#endif

#endif
