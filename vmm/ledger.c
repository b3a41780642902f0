/* SPDX-License-Identifier: Apache-2.0 */
/* ledger.c: bookkeeping of reservations, chunks and mappings, with every precondition of
 * vmm.h checked. sim is this plus a fake address space; host consults it before each mmap,
 * so a bad call is refused with a message instead of silently replacing a mapping.
 *
 * - Reservations: a sorted array (few, long-lived), binary-searched; each counts the
 *   mappings inside it, so "unreserve with mappings" is O(1).
 * - Chunks: a slot array; a handle is (generation << 32) | (slot + 1), so lookups are O(1)
 *   and a released handle is recognised as stale. Each chunk counts its mappings.
 * - Mappings: one treap keyed by start address (base/treap.h; split/join, expected
 *   O(log n) per call).
 *   map checks the one predecessor for overlap; unmap splits out [addr, addr+size), checks
 *   that it is exactly whole, contiguous mappings, and drops or re-merges it.
 * Not thread-safe: the backend holds its lock around each call. */
#include "treap.h"
#include "vmm_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct node_s node_t;
struct node_s {
  uintptr_t addr;
  size_t size;
  expseg_vmm_handle h;
  EXPSEG_TREAP_LINK(node_t) link; /* link.l: the free list's next */
};
#define NODE_ADDR(n) ((n)->addr)
#define ADDR_LESS(x, y) ((x) < (y))
EXPSEG_TREAP_DEFINE(maps, node_t, link, uintptr_t, NODE_ADDR, ADDR_LESS)

typedef struct {
  uintptr_t addr;
  size_t size;
  size_t nmapped; /* mappings inside */
} resv_t;

typedef struct {
  uint64_t size;
  uint64_t user;
  uint32_t gen;
  uint32_t next_free; /* slot + 1; 0 = end */
  uint64_t maps;      /* live mappings of this chunk */
  bool live;
  bool imported;
} chunk_t;

struct expseg_ledger_s {
  const char *name;
  size_t g;
  resv_t *resv;
  size_t nresv, capresv;
  chunk_t *chunks;
  size_t nchunks, capchunks;
  uint32_t chunk_free; /* slot + 1 */
  node_t *root;
  node_t *node_free; /* free list through ->link.l */
  size_t nmappings;
  uint64_t rng;
};

expseg_ledger_t *_expseg_ledger_new(const char *backend_name, size_t granularity) {
  expseg_ledger_t *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->name = backend_name;
  l->g = granularity;
  l->rng = 0x9e3779b97f4a7c15ull;
  return l;
}

static void free_tree(node_t *n) {
  while (n) {
    free_tree(n->link.r);
    node_t *left = n->link.l;
    free(n);
    n = left;
  }
}

void _expseg_ledger_free(expseg_ledger_t *l) {
  if (!l) return;
  free_tree(l->root);
  for (node_t *n = l->node_free; n;) {
    node_t *next = n->link.l;
    free(n);
    n = next;
  }
  free(l->resv);
  free(l->chunks);
  free(l);
}

size_t _expseg_ledger_mapping_count(const expseg_ledger_t *l) { return l->nmappings; }

/* ---- reservations ---- */

/* Index of the last reservation starting at or before addr, or -1. */
static ptrdiff_t resv_at_or_before(const expseg_ledger_t *l, uintptr_t addr) {
  size_t lo = 0, hi = l->nresv;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (l->resv[mid].addr <= addr) lo = mid + 1;
    else hi = mid;
  }
  return (ptrdiff_t)lo - 1;
}

/* The reservation holding all of [addr, addr+size), or NULL with the message set. */
static resv_t *resv_holding(expseg_ledger_t *l, uintptr_t addr, size_t size, const char *call) {
  ptrdiff_t i = resv_at_or_before(l, addr);
  if (i >= 0) {
    resv_t *r = &l->resv[i];
    if (addr - r->addr < r->size && size <= r->size - (addr - r->addr)) return r;
  }
  char b[32];
  _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                    "%s driver: %s(addr=0x%llx, size=%s): the range is not inside one live "
                    "reservation",
                    l->name, call, (unsigned long long)addr, _expseg_format_size(b, size));
  return NULL;
}

expseg_status _expseg_ledger_reserve(expseg_ledger_t *l, uintptr_t addr, size_t size) {
  ptrdiff_t i = resv_at_or_before(l, addr);
  bool overlaps_prev = i >= 0 && addr - l->resv[i].addr < l->resv[i].size;
  bool overlaps_next = (size_t)(i + 1) < l->nresv && l->resv[i + 1].addr - addr < size;
  if (overlaps_prev || overlaps_next)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s driver: reserve: 0x%llx (+%zu) overlaps a live reservation",
                             l->name, (unsigned long long)addr, size);
  if (l->nresv == l->capresv) {
    size_t cap = l->capresv ? l->capresv * 2 : 16;
    resv_t *n = realloc(l->resv, cap * sizeof *n);
    if (!n)
      return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                               "%s driver: reserve: out of host memory for the reservation table",
                               l->name);
    l->resv = n;
    l->capresv = cap;
  }
  size_t at = (size_t)(i + 1);
  memmove(&l->resv[at + 1], &l->resv[at], (l->nresv - at) * sizeof *l->resv);
  l->resv[at] = (resv_t){addr, size, 0};
  l->nresv++;
  return EXPSEG_OK;
}

expseg_status _expseg_ledger_unreserve(expseg_ledger_t *l, uintptr_t addr, size_t size,
                                       bool commit) {
  ptrdiff_t i = resv_at_or_before(l, addr);
  char b[32];
  if (i < 0 || l->resv[i].addr != addr || l->resv[i].size != size)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s driver: unreserve(addr=0x%llx, size=%s): not exactly one live "
                             "reservation",
                             l->name, (unsigned long long)addr, _expseg_format_size(b, size));
  if (l->resv[i].nmapped)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s driver: unreserve(addr=0x%llx, size=%s): %zu mapping(s) still "
                             "inside; unmap them first",
                             l->name, (unsigned long long)addr, _expseg_format_size(b, size),
                             l->resv[i].nmapped);
  if (commit) {
    memmove(&l->resv[i], &l->resv[i + 1], (l->nresv - (size_t)i - 1) * sizeof *l->resv);
    l->nresv--;
  }
  return EXPSEG_OK;
}

/* ---- chunks ---- */

static chunk_t *chunk_lookup(expseg_ledger_t *l, expseg_vmm_handle h, const char *call) {
  uint64_t idx = h & 0xffffffffu;
  uint32_t gen = (uint32_t)(h >> 32);
  if (idx == 0 || idx > l->nchunks || !l->chunks[idx - 1].live || l->chunks[idx - 1].gen != gen) {
    _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                      "%s driver: %s(handle=0x%llx): not a live chunk of this driver", l->name,
                      call, (unsigned long long)h);
    return NULL;
  }
  return &l->chunks[idx - 1];
}

expseg_status _expseg_ledger_chunk_new(expseg_ledger_t *l, size_t size, uint64_t user,
                                       bool imported, expseg_vmm_handle *h) {
  uint32_t idx;
  if (l->chunk_free) {
    idx = l->chunk_free - 1;
    l->chunk_free = l->chunks[idx].next_free;
  } else {
    if (l->nchunks == l->capchunks) {
      size_t cap = l->capchunks ? l->capchunks * 2 : 64;
      chunk_t *n = cap < 0xffffffffu ? realloc(l->chunks, cap * sizeof *n) : NULL;
      if (!n)
        return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                                 "%s driver: create: out of host memory for the chunk table",
                                 l->name);
      l->chunks = n;
      l->capchunks = cap;
    }
    idx = (uint32_t)l->nchunks++;
    l->chunks[idx].gen = 0;
  }
  chunk_t *c = &l->chunks[idx];
  c->gen++;
  c->size = size;
  c->user = user;
  c->maps = 0;
  c->live = true;
  c->imported = imported;
  c->next_free = 0;
  *h = ((uint64_t)c->gen << 32) | (uint64_t)(idx + 1);
  return EXPSEG_OK;
}

expseg_status _expseg_ledger_chunk_get(expseg_ledger_t *l, expseg_vmm_handle h, size_t *size,
                                       uint64_t *user, bool *imported) {
  chunk_t *c = chunk_lookup(l, h, "chunk");
  if (!c) return EXPSEG_ERR_INVALID_ARGUMENT;
  if (size) *size = c->size;
  if (user) *user = c->user;
  if (imported) *imported = c->imported;
  return EXPSEG_OK;
}

expseg_status _expseg_ledger_chunk_set_user(expseg_ledger_t *l, expseg_vmm_handle h,
                                            uint64_t user) {
  chunk_t *c = chunk_lookup(l, h, "chunk");
  if (!c) return EXPSEG_ERR_INVALID_ARGUMENT;
  c->user = user;
  return EXPSEG_OK;
}

expseg_status _expseg_ledger_chunk_release(expseg_ledger_t *l, expseg_vmm_handle h,
                                           bool commit) {
  chunk_t *c = chunk_lookup(l, h, "release");
  if (!c) return EXPSEG_ERR_INVALID_ARGUMENT;
  if (c->maps)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s driver: release(handle=0x%llx): the chunk is still mapped "
                             "%llu time(s); unmap it first",
                             l->name, (unsigned long long)h, (unsigned long long)c->maps);
  if (commit) {
    c->live = false;
    c->next_free = l->chunk_free;
    l->chunk_free = (uint32_t)(c - l->chunks) + 1;
  }
  return EXPSEG_OK;
}

void _expseg_ledger_foreach_resv(expseg_ledger_t *l,
                                 void (*fn)(void *ctx, uintptr_t addr, size_t size), void *ctx) {
  for (size_t i = 0; i < l->nresv; i++) fn(ctx, l->resv[i].addr, l->resv[i].size);
}

/* ---- mappings: the treap keyed by address ---- */


expseg_status _expseg_ledger_map(expseg_ledger_t *l, uintptr_t addr, size_t size,
                                 expseg_vmm_handle h, size_t offset) {
  char b[32], c2[32];
  resv_t *r = resv_holding(l, addr, size, "map");
  if (!r) return EXPSEG_ERR_INVALID_ARGUMENT;
  chunk_t *c = chunk_lookup(l, h, "map");
  if (!c) return EXPSEG_ERR_INVALID_ARGUMENT;
  if (offset > c->size || size > c->size - offset)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s driver: map(addr=0x%llx, size=%s, offset=%zu): the chunk "
                             "0x%llx is only %s",
                             l->name, (unsigned long long)addr, _expseg_format_size(b, size),
                             offset, (unsigned long long)h, _expseg_format_size(c2, c->size));
  node_t *p = maps_pred(l->root, addr + size);
  if (p && p->addr + p->size > addr)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s driver: map(addr=0x%llx, size=%s): overlaps the mapping at "
                             "0x%llx (+%s) of chunk 0x%llx; unmap it first",
                             l->name, (unsigned long long)addr, _expseg_format_size(b, size),
                             (unsigned long long)p->addr, _expseg_format_size(c2, p->size),
                             (unsigned long long)p->h);
  node_t *n = l->node_free;
  if (n) {
    l->node_free = n->link.l;
  } else if (!(n = malloc(sizeof *n))) {
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "%s driver: map: out of host memory for the mapping table", l->name);
  }
  *n = (node_t){.addr = addr, .size = size, .h = h, .link = {NULL, NULL, _expseg_treap_prio(&l->rng)}};
  maps_insert(&l->root, n);
  c->maps++;
  r->nmapped++;
  l->nmappings++;
  return EXPSEG_OK;
}

typedef struct {
  uintptr_t next; /* where the next mapping must start */
  const node_t *bad;
  size_t count;
} walk_t;

/* In order: checks that the mappings are contiguous from w->next on. */
static void walk_contiguous(const node_t *t, walk_t *w) {
  if (!t || w->bad) return;
  walk_contiguous(t->link.l, w);
  if (w->bad) return;
  if (t->addr != w->next) {
    w->bad = t;
    return;
  }
  w->next = t->addr + t->size;
  w->count++;
  walk_contiguous(t->link.r, w);
}

static void drop_tree(expseg_ledger_t *l, node_t *t) {
  while (t) {
    drop_tree(l, t->link.r);
    node_t *left = t->link.l;
    chunk_t *c = chunk_lookup(l, t->h, "unmap");
    if (c) c->maps--;
    t->link.l = l->node_free;
    l->node_free = t;
    t = left;
  }
}

expseg_status _expseg_ledger_unmap(expseg_ledger_t *l, uintptr_t addr, size_t size, bool commit) {
  resv_t *r = resv_holding(l, addr, size, "unmap");
  if (!r) return EXPSEG_ERR_INVALID_ARGUMENT;
  uintptr_t end = addr + size;
  node_t *a, *m, *c;
  maps_split(l->root, addr, &a, &m);
  maps_split(m, end, &m, &c);
  walk_t w = {addr, NULL, 0};
  walk_contiguous(m, &w);
  char b[32], b2[32];
  expseg_status st = EXPSEG_OK;
  node_t *before = maps_pred(a, addr);
  if (before && before->addr + before->size > addr) {
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "%s driver: unmap(addr=0x%llx, size=%s): starts inside the mapping "
                           "at 0x%llx (+%s); only whole mappings can be unmapped",
                           l->name, (unsigned long long)addr, _expseg_format_size(b, size),
                           (unsigned long long)before->addr,
                           _expseg_format_size(b2, before->size));
  } else if (w.bad || w.next < end) {
    uintptr_t hole = w.next;
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "%s driver: unmap(addr=0x%llx, size=%s): 0x%llx is not mapped",
                           l->name, (unsigned long long)addr, _expseg_format_size(b, size),
                           (unsigned long long)hole);
  } else if (w.next > end) {
    node_t *last = maps_pred(m, end);
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "%s driver: unmap(addr=0x%llx, size=%s): ends inside the mapping at "
                           "0x%llx (+%s); only whole mappings can be unmapped",
                           l->name, (unsigned long long)addr, _expseg_format_size(b, size),
                           (unsigned long long)(last ? last->addr : 0),
                           _expseg_format_size(b2, last ? last->size : 0));
  }
  if (st == EXPSEG_OK && commit) {
    drop_tree(l, m);
    r->nmapped -= w.count;
    l->nmappings -= w.count;
    l->root = maps_join(a, c);
  } else {
    l->root = maps_join(maps_join(a, m), c);
  }
  return st;
}

expseg_status _expseg_ledger_check_mapped(expseg_ledger_t *l, uintptr_t addr, size_t size,
                                          const char *call) {
  if (!resv_holding(l, addr, size, call)) return EXPSEG_ERR_INVALID_ARGUMENT;
  uintptr_t end = addr + size;
  node_t *p = maps_pred(l->root, addr + 1);
  uintptr_t covered = addr;
  if (p && p->addr + p->size > addr) covered = p->addr + p->size;
  while (covered < end) {
    node_t *n = (covered == addr) ? NULL : maps_find(l->root, covered);
    if (!n) {
      char b[32];
      return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                               "%s driver: %s(addr=0x%llx, size=%s): 0x%llx is not mapped",
                               l->name, call, (unsigned long long)addr,
                               _expseg_format_size(b, size), (unsigned long long)covered);
    }
    covered = n->addr + n->size;
  }
  return EXPSEG_OK;
}
