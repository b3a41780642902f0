/* ptrmap.c: pointer -> block for live (allocated or pending-free) blocks, so free() finds
 * its block in O(1). Open addressing with linear probing and backward-shift deletion;
 * capacity a power of two, kept at most half full. Key 0 marks an empty slot (the
 * allocator never hands out address 0). */
#include "internal.h"

#include <stdlib.h>

static inline size_t slot_of(const ptrmap_t *m, uintptr_t key) {
  uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 20) & (m->cap - 1);
}

bool _expseg_ptrmap_init(ptrmap_t *m) {
  m->cap = 1024;
  m->count = 0;
  m->keys = calloc(m->cap, sizeof *m->keys);
  m->vals = calloc(m->cap, sizeof *m->vals);
  if (m->keys == NULL || m->vals == NULL) {
    _expseg_ptrmap_destroy(m);
    return false;
  }
  return true;
}

void _expseg_ptrmap_destroy(ptrmap_t *m) {
  free(m->keys);
  free(m->vals);
  m->keys = NULL;
  m->vals = NULL;
  m->cap = m->count = 0;
}

static bool grow(ptrmap_t *m) {
  ptrmap_t n = {.cap = m->cap * 2, .count = 0};
  n.keys = calloc(n.cap, sizeof *n.keys);
  n.vals = calloc(n.cap, sizeof *n.vals);
  if (n.keys == NULL || n.vals == NULL) {
    free(n.keys);
    free(n.vals);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (m->keys[i] == 0) continue;
    size_t j = slot_of(&n, m->keys[i]);
    while (n.keys[j] != 0) j = (j + 1) & (n.cap - 1);
    n.keys[j] = m->keys[i];
    n.vals[j] = m->vals[i];
    n.count++;
  }
  free(m->keys);
  free(m->vals);
  *m = n;
  return true;
}

bool _expseg_ptrmap_put(ptrmap_t *m, uintptr_t key, block_t *b) {
  if ((m->count + 1) * 2 > m->cap && !grow(m)) return false;
  size_t i = slot_of(m, key);
  while (m->keys[i] != 0 && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
  if (m->keys[i] == 0) m->count++;
  m->keys[i] = key;
  m->vals[i] = b;
  return true;
}

block_t *_expseg_ptrmap_get(const ptrmap_t *m, uintptr_t key) {
  if (key == 0) return NULL;
  size_t i = slot_of(m, key);
  while (m->keys[i] != 0) {
    if (m->keys[i] == key) return m->vals[i];
    i = (i + 1) & (m->cap - 1);
  }
  return NULL;
}

block_t *_expseg_ptrmap_take(ptrmap_t *m, uintptr_t key) {
  if (key == 0) return NULL;
  size_t i = slot_of(m, key);
  while (m->keys[i] != key) {
    if (m->keys[i] == 0) return NULL;
    i = (i + 1) & (m->cap - 1);
  }
  block_t *b = m->vals[i];
  /* backward-shift deletion keeps every probe chain unbroken */
  size_t j = i;
  for (;;) {
    j = (j + 1) & (m->cap - 1);
    if (m->keys[j] == 0) break;
    size_t home = slot_of(m, m->keys[j]);
    /* move j into the hole i if its home is not in (i, j] cyclically */
    bool between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (!between) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->keys[i] = 0;
  m->vals[i] = NULL;
  m->count--;
  return b;
}
