/* SPDX-License-Identifier: Apache-2.0 */
/* alloc_support.c: helpers for the allocator-core tests (alloc_support.h). The borrow
 * driver forwards to the inner driver's wrappers (so the inner driver checks and counts
 * every call) and remembers each chunk's size, which release needs and the backend op
 * lacks. */
#include "alloc_support.h"
#include "expseg_testing.h"

#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

expseg_vmm_t *alloc_test_driver(expseg_allocator *a) { return a->drv; }

expseg_status alloc_test_hold(expseg_allocator *a, expseg_stream s, bool hold) {
  return expseg_testing_hold_stream(a, s, hold);
}

expseg_status alloc_test_create(expseg_vmm_t *drv, const char *config, expseg_allocator **out) {
  return _expseg_create_with_driver(drv, config, out);
}

size_t alloc_test_page(const expseg_allocator *a) { return a->page; }

size_t alloc_test_free_streams(expseg_allocator *a, bool small) {
  pthread_mutex_lock(&a->lock);
  const size_t n = a->free_idx.streams[small ? POOL_SMALL : POOL_LARGE];
  pthread_mutex_unlock(&a->lock);
  return n;
}

uint64_t alloc_test_calls(expseg_allocator *a, expseg_vmm_call c) {
  return atomic_load(&a->drv->calls[c]);
}

bool alloc_test_lock_is_free(expseg_allocator *a) {
  if (pthread_mutex_trylock(&a->lock) != 0) return false;
  pthread_mutex_unlock(&a->lock);
  return true;
}

/* ---- the borrow driver ---- */

typedef struct {
  expseg_vmm_handle h;
  size_t size;
} bslot_t;

typedef struct {
  expseg_vmm_t *inner;
  pthread_mutex_t mu;
  bslot_t *tab; /* unsorted; chunks are few in tests */
  size_t n, cap;
} borrow_t;

static expseg_status b_reserve(void *st, size_t size, size_t align, uintptr_t *addr) {
  return _expseg_vmm_reserve(((borrow_t *)st)->inner, size, align, addr);
}
static expseg_status b_unreserve(void *st, uintptr_t addr, size_t size) {
  return _expseg_vmm_unreserve(((borrow_t *)st)->inner, addr, size);
}
static expseg_status b_create(void *st, size_t size, expseg_vmm_handle *h) {
  borrow_t *b = st;
  expseg_status s = _expseg_vmm_create(b->inner, size, h);
  if (s != EXPSEG_OK) return s;
  pthread_mutex_lock(&b->mu);
  if (b->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    bslot_t *t = realloc(b->tab, cap * sizeof *t);
    if (t == NULL) abort(); /* test helper: host memory exhausted */
    b->tab = t;
    b->cap = cap;
  }
  b->tab[b->n++] = (bslot_t){*h, size};
  pthread_mutex_unlock(&b->mu);
  return EXPSEG_OK;
}
static expseg_status b_release(void *st, expseg_vmm_handle h) {
  borrow_t *b = st;
  size_t size = 0, i;
  pthread_mutex_lock(&b->mu);
  for (i = 0; i < b->n; i++)
    if (b->tab[i].h == h) break;
  if (i < b->n) size = b->tab[i].size;
  pthread_mutex_unlock(&b->mu);
  expseg_status s = _expseg_vmm_release(b->inner, h, size);
  if (s == EXPSEG_OK) { /* b->n is read under the mutex only: other threads change it */
    pthread_mutex_lock(&b->mu);
    for (i = 0; i < b->n; i++)
      if (b->tab[i].h == h) {
        b->tab[i] = b->tab[--b->n];
        break;
      }
    pthread_mutex_unlock(&b->mu);
  }
  return s;
}
static expseg_status b_map(void *st, uintptr_t addr, size_t size, expseg_vmm_handle h,
                           size_t offset) {
  return _expseg_vmm_map(((borrow_t *)st)->inner, addr, size, h, offset);
}
static expseg_status b_unmap(void *st, uintptr_t addr, size_t size) {
  return _expseg_vmm_unmap(((borrow_t *)st)->inner, addr, size);
}
static expseg_status b_set_access(void *st, uintptr_t addr, size_t size, int device) {
  return _expseg_vmm_set_access_dev(((borrow_t *)st)->inner, addr, size, device);
}
static expseg_status b_event_create(void *st, expseg_vmm_event *ev) {
  return _expseg_vmm_event_create(((borrow_t *)st)->inner, ev);
}
static expseg_status b_event_destroy(void *st, expseg_vmm_event ev) {
  return _expseg_vmm_event_destroy(((borrow_t *)st)->inner, ev);
}
static expseg_status b_event_record(void *st, expseg_vmm_event ev, expseg_stream s) {
  return _expseg_vmm_event_record(((borrow_t *)st)->inner, ev, s);
}
static expseg_status b_event_query(void *st, expseg_vmm_event ev, bool *done) {
  return _expseg_vmm_event_query(((borrow_t *)st)->inner, ev, done);
}
static expseg_status b_event_synchronize(void *st, expseg_vmm_event ev) {
  return _expseg_vmm_event_synchronize(((borrow_t *)st)->inner, ev);
}
static expseg_status b_stream_synchronize(void *st, expseg_stream s) {
  return _expseg_vmm_stream_synchronize(((borrow_t *)st)->inner, s);
}
static expseg_status b_export_fd(void *st, expseg_vmm_handle h, int *fd, size_t *offset) {
  return _expseg_vmm_export_fd(((borrow_t *)st)->inner, h, fd, offset);
}
static expseg_status b_import_fd(void *st, int fd, size_t offset, size_t size,
                                 expseg_vmm_handle *h) {
  return _expseg_vmm_import_fd(((borrow_t *)st)->inner, fd, offset, size, h);
}
static size_t b_granularity(void *st) { return ((borrow_t *)st)->inner->granularity; }
static void b_mem_info(void *st, size_t *free_bytes, size_t *total_bytes) {
  _expseg_vmm_mem_info(((borrow_t *)st)->inner, free_bytes, total_bytes);
}
static uint64_t b_now_ns(void *st) { return _expseg_vmm_now_ns(((borrow_t *)st)->inner); }
static void b_hold_stream(void *st, expseg_stream s, bool hold) {
  (void)_expseg_vmm_hold_stream(((borrow_t *)st)->inner, s, hold);
}
static void b_destroy(void *st) { /* inner stays open: the test closes it */
  borrow_t *b = st;
  pthread_mutex_destroy(&b->mu);
  free(b->tab);
  free(b);
}

static const expseg_vmm_ops_t borrow_ops = {
    .name = "borrow", .reserve = b_reserve, .unreserve = b_unreserve, .create = b_create,
    .release = b_release, .map = b_map, .unmap = b_unmap, .set_access = b_set_access,
    .event_create = b_event_create, .event_destroy = b_event_destroy,
    .event_record = b_event_record, .event_query = b_event_query,
    .event_synchronize = b_event_synchronize, .stream_synchronize = b_stream_synchronize,
    .export_fd = b_export_fd, .import_fd = b_import_fd, .granularity = b_granularity,
    .mem_info = b_mem_info, .now_ns = b_now_ns, .hold_stream = b_hold_stream,
    .destroy = b_destroy,
};

expseg_status alloc_test_borrow(expseg_vmm_t *inner, expseg_vmm_t **out) {
  borrow_t *b = calloc(1, sizeof *b);
  if (b == NULL) return EXPSEG_ERR_OUT_OF_MEMORY;
  b->inner = inner;
  pthread_mutex_init(&b->mu, NULL);
  return _expseg_vmm_wrap(&borrow_ops, b, inner->device, out);
}
