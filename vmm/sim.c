/* SPDX-License-Identifier: Apache-2.0 */
/* sim.c: the simulated backend: bookkeeping only, nothing is mapped or touched.
 *
 * Lets the allocator replay traces of an 80 GiB GPU on a laptop, fast. reserve hands out
 * addresses from a fake space starting at 2^48 (above the 47-bit user space of x86-64 and
 * aarch64 with 4-level tables, so a stray dereference faults instead of corrupting memory),
 * one space per live driver (slot_take) so that allocators never share an address;
 * free extents are a range set (ranges.c: first fit, coalescing; reservations are few).
 * Chunks, mappings and every precondition are the ledger's (ledger.c: O(log n) per call);
 * capacity is enforced as in host; streams and events are the shared model (stream_model.c).
 * One mutex guards the state. */
#include "vmm_impl.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define SIM_BASE (1ull << 48)
#define SIM_TOP (1ull << 62) /* addresses stay positive 63-bit integers in snapshots */
#define SIM_SLOTS 1024

/* Each live sim driver reserves from a space of its own, as devices (and two allocators of
 * one device) get distinct addresses from CUDA: a pointer of one allocator is then foreign
 * to every other one. The lowest free slot is taken, so a process that makes one driver at
 * a time gets the same addresses each time. Slots beyond what fits under SIM_TOP share the
 * first space. */
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t slots_used[SIM_SLOTS / 64];

static uint64_t span_of(uint64_t va_size) {
  uint64_t span = 1ull << 40;
  while (span < va_size) span <<= 1;
  return span;
}

static unsigned slot_take(uint64_t va_size) {
  const uint64_t n = (SIM_TOP - SIM_BASE) / span_of(va_size);
  pthread_mutex_lock(&slots_mu);
  unsigned slot = 0;
  for (unsigned i = 0; i < SIM_SLOTS && i < n; i++)
    if (!(slots_used[i / 64] >> (i % 64) & 1)) {
      slots_used[i / 64] |= 1ull << (i % 64);
      slot = i + 1;
      break;
    }
  pthread_mutex_unlock(&slots_mu);
  return slot; /* 0: none free (the first space, shared) */
}

static void slot_put(unsigned slot) {
  if (slot == 0) return;
  pthread_mutex_lock(&slots_mu);
  slots_used[(slot - 1) / 64] &= ~(1ull << ((slot - 1) % 64));
  pthread_mutex_unlock(&slots_mu);
}

typedef struct {
  expseg_smodel_t *streams; /* first: the shared event entry points find it here */
  pthread_mutex_t mu;
  expseg_sim_opts_t o;
  size_t in_use;
  expseg_ledger_t *ledger;
  expseg_ranges_t free_va;
  expseg_access_t *access; /* which devices may access what (access.c) */
  int device;
  unsigned slot; /* slot_take's: 1 + the index of its address space; 0 = the first, shared */
} sim_t;
_Static_assert(offsetof(sim_t, streams) == 0, "the stream model comes first");

static expseg_status sim_reserve(void *st, size_t size, size_t align, uintptr_t *addr) {
  sim_t *s = st;
  if (align < s->o.granularity) align = s->o.granularity;
  pthread_mutex_lock(&s->mu);
  uint64_t a = 0;
  int got = s->o.top_down ? _expseg_ranges_take_top(&s->free_va, size, align, &a)
                          : _expseg_ranges_take(&s->free_va, size, align, &a);
  expseg_status r = EXPSEG_ERR_OUT_OF_MEMORY;
  if (got > 0) {
    r = _expseg_ledger_reserve(s->ledger, (uintptr_t)a, size);
    if (r != EXPSEG_OK) _expseg_ranges_put(&s->free_va, a, size); /* as it was: cannot fail */
  } else if (got < 0) {
    r = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                          "sim driver: reserve: out of host memory for the free list");
  }
  pthread_mutex_unlock(&s->mu);
  if (got > 0 && r == EXPSEG_OK) *addr = (uintptr_t)a;
  if (got != 0) return r;
  char b1[32], b2[32];
  return _expseg_error_set(r, "sim driver: reserve(size=%s): address space exhausted (va=%s); "
                              "raise va= in the driver spec",
                           _expseg_format_size(b1, size), _expseg_format_size(b2, s->o.va_size));
}

static expseg_status sim_unreserve(void *st, uintptr_t addr, size_t size) {
  sim_t *s = st;
  pthread_mutex_lock(&s->mu);
  expseg_status r = _expseg_ledger_unreserve(s->ledger, addr, size, false);
  if (r == EXPSEG_OK) {
    if (!_expseg_ranges_put(&s->free_va, addr, size))
      r = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                            "sim driver: unreserve: out of host memory for the free list");
    else _expseg_ledger_unreserve(s->ledger, addr, size, true);
  }
  pthread_mutex_unlock(&s->mu);
  return r;
}

static expseg_status sim_create(void *st, size_t size, expseg_vmm_handle *h) {
  sim_t *s = st;
  char b1[32], b2[32], b3[32];
  pthread_mutex_lock(&s->mu);
  expseg_status r;
  if (size > s->o.capacity - s->in_use) {
    r = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "sim driver: capacity %s, %s in use, asked %s",
                          _expseg_format_size(b1, s->o.capacity),
                          _expseg_format_size(b2, s->in_use), _expseg_format_size(b3, size));
  } else {
    r = _expseg_ledger_chunk_new(s->ledger, size, 0, false, h);
    if (r == EXPSEG_OK) s->in_use += size;
  }
  pthread_mutex_unlock(&s->mu);
  return r;
}

static expseg_status sim_release(void *st, expseg_vmm_handle h) {
  sim_t *s = st;
  size_t size = 0;
  bool imported = false;
  pthread_mutex_lock(&s->mu);
  expseg_status r = _expseg_ledger_chunk_release(s->ledger, h, false);
  if (r == EXPSEG_OK) {
    _expseg_ledger_chunk_get(s->ledger, h, &size, NULL, &imported);
    _expseg_ledger_chunk_release(s->ledger, h, true);
    if (!imported) s->in_use -= size;
  }
  pthread_mutex_unlock(&s->mu);
  return r;
}

static expseg_status sim_map(void *st, uintptr_t addr, size_t size, expseg_vmm_handle h,
                             size_t offset) {
  sim_t *s = st;
  pthread_mutex_lock(&s->mu);
  expseg_status r = _expseg_ledger_map(s->ledger, addr, size, h, offset);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static expseg_status sim_unmap(void *st, uintptr_t addr, size_t size) {
  sim_t *s = st;
  pthread_mutex_lock(&s->mu);
  expseg_status r = _expseg_ledger_unmap(s->ledger, addr, size, true);
  if (r == EXPSEG_OK) _expseg_access_unmap(s->access, addr, size);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static expseg_status sim_set_access(void *st, uintptr_t addr, size_t size, int device) {
  sim_t *s = st;
  pthread_mutex_lock(&s->mu);
  expseg_status r = _expseg_ledger_check_mapped(s->ledger, addr, size, "set_access");
  if (r == EXPSEG_OK) r = _expseg_access_apply(s->access, "sim", addr, size, device, s->device);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static expseg_status sim_has_access(void *st, uintptr_t addr, size_t size, int device,
                                    int *state) {
  sim_t *s = st;
  return _expseg_access_query(&s->mu, s->access, addr, size, device, state);
}

static expseg_status sim_export_fd(void *st, expseg_vmm_handle h, int *fd, size_t *offset) {
  (void)st, (void)h, (void)fd, (void)offset;
  return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                           "sim driver: export_fd: simulated chunks have no memory to share "
                           "(use the host driver)");
}

static expseg_status sim_import_fd(void *st, int fd, size_t offset, size_t size,
                                   expseg_vmm_handle *h) {
  (void)st, (void)fd, (void)offset, (void)size, (void)h;
  return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                           "sim driver: import_fd: simulated chunks have no memory to share "
                           "(use the host driver)");
}

static size_t sim_granularity(void *st) { return ((sim_t *)st)->o.granularity; }

static void sim_mem_info(void *st, size_t *free_bytes, size_t *total_bytes) {
  sim_t *s = st;
  pthread_mutex_lock(&s->mu);
  *free_bytes = s->o.capacity - s->in_use;
  *total_bytes = s->o.capacity;
  pthread_mutex_unlock(&s->mu);
}


static void sim_destroy(void *st) {
  sim_t *s = st;
  if (!s) return;
  _expseg_ledger_free(s->ledger);
  _expseg_access_free(s->access);
  _expseg_smodel_free(s->streams);
  _expseg_ranges_free(&s->free_va);
  slot_put(s->slot);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static const expseg_vmm_ops_t sim_ops = {
    .name = "sim",
    .reserve = sim_reserve,
    .unreserve = sim_unreserve,
    .create = sim_create,
    .release = sim_release,
    .map = sim_map,
    .unmap = sim_unmap,
    .set_access = sim_set_access,
    EXPSEG_MODELLED_OPS,
    .export_fd = sim_export_fd,
    .import_fd = sim_import_fd,
    .granularity = sim_granularity,
    .mem_info = sim_mem_info,
    .destroy = sim_destroy,
    .has_access = sim_has_access,
};

expseg_status _expseg_sim_new(const expseg_sim_opts_t *o, int device, expseg_vmm_t **out) {
  if (!o || !out)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "sim driver: NULL options or out");
  *out = NULL;
  size_t g = o->granularity;
  char b[32];
  if (g < 4096 || (g & (g - 1)) || g > (1ull << 30))
    return _expseg_error_set(EXPSEG_ERR_CONFIG,
                             "sim driver: granularity=%zu: expected a power of two from 4K to 1G",
                             g);
  if (o->capacity == 0)
    return _expseg_error_set(EXPSEG_ERR_CONFIG, "sim driver: capacity=0: expected SIZE > 0");
  if (o->va_size < g || o->va_size > (1ull << 52))
    return _expseg_error_set(EXPSEG_ERR_CONFIG,
                             "sim driver: va=%llu: expected a size from the granularity (%s) "
                             "to 4096T",
                             (unsigned long long)o->va_size, _expseg_format_size(b, g));
  sim_t *s = calloc(1, sizeof *s);
  if (!s) return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "sim driver: out of host memory");
  pthread_mutex_init(&s->mu, NULL);
  s->o = *o;
  s->o.va_size &= ~(uint64_t)(g - 1);
  s->ledger = _expseg_ledger_new("sim", g);
  s->streams = _expseg_smodel_new("sim");
  s->access = _expseg_access_new();
  s->device = device;
  s->slot = slot_take(s->o.va_size);
  const uint64_t base = SIM_BASE + (s->slot ? s->slot - 1 : 0) * span_of(s->o.va_size);
  if (!s->ledger || !s->streams || !s->access ||
      !_expseg_ranges_put(&s->free_va, base, s->o.va_size)) {
    sim_destroy(s);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "sim driver: out of host memory");
  }
  return _expseg_vmm_wrap(&sim_ops, s, device, out);
}
