/* SPDX-License-Identifier: Apache-2.0 */
/* host.c: the host backend, real memory standing in for a GPU.
 *
 * reserve   = mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE), over-reserved and
 *             trimmed to the alignment asked (at least the granularity);
 * create    = a range of a large sparse memfd "arena" (host_arena.c): no descriptor per
 *             chunk; its pages exist once touched;
 * release   = the range's pages punched out of the arena (back to the OS), range reusable;
 * map       = mmap(MAP_FIXED|MAP_SHARED, arena fd, chunk offset + offset) with PROT_NONE
 *             (like cuMemMap: no access until set_access), then bound to the NUMA node when
 *             numa=N was given;
 * set_access= mprotect(PROT_READ|PROT_WRITE);
 * unmap     = mmap(MAP_FIXED, PROT_NONE, private anonymous) over the range, so the
 *             reservation stays reserved (munmap would open a hole);
 * unreserve = munmap;
 * export_fd = a dup of the arena fd and the chunk's offset in it (the range is then never
 *             reused); import_fd = a dup of the given fd kept with the offset, one per chunk.
 * Chunks count against `capacity`; imported chunks do not (they are another process's
 * memory, counted by its driver). Every call is checked against a ledger first, so a call
 * that breaks a precondition is refused instead of silently replacing a mapping. Streams
 * and events are the shared model (stream_model.c). One mutex guards the ledger, the arenas
 * and the counters. */
#include "vmm_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

typedef struct {
  expseg_smodel_t *streams; /* first: the shared event entry points find it here */
  pthread_mutex_t mu;
  expseg_host_opts_t o;
  size_t in_use; /* bytes of created (not imported) chunks */
  expseg_ledger_t *ledger;
  expseg_arenas_t *arenas; /* where chunks live */
  expseg_access_t *access; /* which devices may access what (access.c) */
  int device;
  atomic_bool bind_warned;
} host_t;
_Static_assert(offsetof(host_t, streams) == 0, "the stream model comes first");

static size_t os_page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static expseg_status sys_fail(const char *call, int err, const char *what) {
  expseg_status s = (err == ENOMEM) ? EXPSEG_ERR_OUT_OF_MEMORY : EXPSEG_ERR_DRIVER;
  return _expseg_error_set(s, "host driver: %s: %s failed: %s", call, what, strerror(err));
}

static expseg_status host_reserve(void *st, size_t size, size_t align, uintptr_t *addr) {
  host_t *h = st;
  if (align < h->o.granularity) align = h->o.granularity;
  size_t extra = align > os_page() ? align : 0;
  if (size + extra < size)
    return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "host driver: reserve: size overflows");
  void *p = mmap(NULL, size + extra, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                 0);
  if (p == MAP_FAILED) return sys_fail("reserve", errno, "mmap(PROT_NONE)");
  uintptr_t base = (uintptr_t)p;
  uintptr_t a = (base + align - 1) & ~(uintptr_t)(align - 1);
  if (extra) {
    if (a > base) munmap(p, a - base);
    size_t tail = base + size + extra - (a + size);
    if (tail) munmap((void *)(a + size), tail);
  }
  pthread_mutex_lock(&h->mu);
  expseg_status s = _expseg_ledger_reserve(h->ledger, a, size);
  pthread_mutex_unlock(&h->mu);
  if (s) {
    munmap((void *)a, size);
    return s;
  }
  *addr = a;
  return EXPSEG_OK;
}

static expseg_status host_unreserve(void *st, uintptr_t addr, size_t size) {
  host_t *h = st;
  pthread_mutex_lock(&h->mu);
  expseg_status s = _expseg_ledger_unreserve(h->ledger, addr, size, false);
  if (s == EXPSEG_OK) {
    if (munmap((void *)addr, size) != 0) s = sys_fail("unreserve", errno, "munmap");
    else _expseg_ledger_unreserve(h->ledger, addr, size, true);
  }
  pthread_mutex_unlock(&h->mu);
  return s;
}

static expseg_status host_create(void *st, size_t size, expseg_vmm_handle *out) {
  host_t *h = st;
  char b1[32], b2[32], b3[32];
  pthread_mutex_lock(&h->mu);
  if (size > h->o.capacity - h->in_use) {
    size_t used = h->in_use;
    pthread_mutex_unlock(&h->mu);
    return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                             "host driver: capacity %s, %s in use, asked %s",
                             _expseg_format_size(b1, h->o.capacity), _expseg_format_size(b2, used),
                             _expseg_format_size(b3, size));
  }
  uint64_t user = 0;
  expseg_status s = _expseg_arenas_claim(h->arenas, size, &user);
  if (s == EXPSEG_OK) {
    s = _expseg_ledger_chunk_new(h->ledger, size, user, false, out);
    if (s) _expseg_arenas_give_back(h->arenas, user, size);
  }
  if (s == EXPSEG_OK) h->in_use += size;
  pthread_mutex_unlock(&h->mu);
  return s;
}

static expseg_status host_release(void *st, expseg_vmm_handle hd) {
  host_t *h = st;
  pthread_mutex_lock(&h->mu);
  size_t size = 0;
  uint64_t user = 0;
  bool imported = false;
  expseg_status s = _expseg_ledger_chunk_release(h->ledger, hd, false);
  if (s == EXPSEG_OK) {
    _expseg_ledger_chunk_get(h->ledger, hd, &size, &user, &imported);
    if (imported) _expseg_arenas_drop(h->arenas, user);
    else s = _expseg_arenas_give_back(h->arenas, user, size);
  }
  if (s == EXPSEG_OK) {
    _expseg_ledger_chunk_release(h->ledger, hd, true);
    if (!imported) h->in_use -= size;
  }
  pthread_mutex_unlock(&h->mu);
  return s;
}

static expseg_status host_map(void *st, uintptr_t addr, size_t size, expseg_vmm_handle hd,
                              size_t offset) {
  host_t *h = st;
  uint64_t user = 0;
  size_t base = 0;
  pthread_mutex_lock(&h->mu);
  expseg_status s = _expseg_ledger_map(h->ledger, addr, size, hd, offset);
  if (s == EXPSEG_OK) {
    _expseg_ledger_chunk_get(h->ledger, hd, NULL, &user, NULL);
    int fd = _expseg_arenas_fd(h->arenas, user, &base);
    void *p = mmap((void *)addr, size, PROT_NONE, MAP_FIXED | MAP_SHARED, fd,
                   (off_t)(base + offset));
    if (p == MAP_FAILED) {
      s = sys_fail("map", errno, "mmap(MAP_FIXED|MAP_SHARED)");
      _expseg_ledger_unmap(h->ledger, addr, size, true);
      /* MAP_FIXED may have dropped part of the old PROT_NONE reservation: restore it. */
      mmap((void *)addr, size, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
           -1, 0);
    }
  }
  pthread_mutex_unlock(&h->mu);
  if (s == EXPSEG_OK && h->o.numa_node >= 0) {
    expseg_status b = _expseg_topo_bind((void *)addr, size, h->o.numa_node);
    if (b != EXPSEG_OK && !atomic_exchange(&h->bind_warned, true))
      _expseg_warn("host driver: cannot place pages on NUMA node %d (%s); memory stays usable, "
                   "placement is left to the OS",
                   h->o.numa_node, _expseg_error_message());
  }
  return s;
}

static expseg_status host_unmap(void *st, uintptr_t addr, size_t size) {
  host_t *h = st;
  pthread_mutex_lock(&h->mu);
  expseg_status s = _expseg_ledger_unmap(h->ledger, addr, size, false);
  if (s == EXPSEG_OK) {
    void *p = mmap((void *)addr, size, PROT_NONE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      s = sys_fail("unmap", errno, "mmap(MAP_FIXED, PROT_NONE)");
    } else {
      _expseg_ledger_unmap(h->ledger, addr, size, true);
      _expseg_access_unmap(h->access, addr, size); /* access goes with the mapping */
    }
  }
  pthread_mutex_unlock(&h->mu);
  return s;
}

static expseg_status host_set_access(void *st, uintptr_t addr, size_t size, int device) {
  host_t *h = st;
  pthread_mutex_lock(&h->mu);
  expseg_status s = _expseg_ledger_check_mapped(h->ledger, addr, size, "set_access");
  /* peers share this process's view: only the owner's grant changes the protection */
  if (s == EXPSEG_OK && device == h->device &&
      mprotect((void *)addr, size, PROT_READ | PROT_WRITE) != 0)
    s = sys_fail("set_access", errno, "mprotect(PROT_READ|PROT_WRITE)");
  if (s == EXPSEG_OK) s = _expseg_access_apply(h->access, "host", addr, size, device, h->device);
  pthread_mutex_unlock(&h->mu);
  return s;
}

static expseg_status host_export_fd(void *st, expseg_vmm_handle hd, int *fd, size_t *offset) {
  host_t *h = st;
  uint64_t user = 0;
  bool imported = false;
  pthread_mutex_lock(&h->mu);
  expseg_status s = _expseg_ledger_chunk_get(h->ledger, hd, NULL, &user, &imported);
  if (s == EXPSEG_OK) {
    size_t base = 0;
    int d = fcntl(_expseg_arenas_fd(h->arenas, user, &base), F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
      s = sys_fail("export_fd", errno, "dup");
    } else {
      *fd = d;
      *offset = base;
      /* Another process may map the range from now on: never punch nor reuse it. */
      if (!imported)
        _expseg_ledger_chunk_set_user(h->ledger, hd, _expseg_arenas_mark_exported(user));
    }
  }
  pthread_mutex_unlock(&h->mu);
  return s;
}

static expseg_status host_import_fd(void *st, int fd, size_t offset, size_t size,
                                    expseg_vmm_handle *out) {
  host_t *h = st;
  struct stat sb;
  char b[32];
  if (fstat(fd, &sb) != 0)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "host driver: import_fd(fd=%d): %s",
                             fd, strerror(errno));
  if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < size ||
      (uint64_t)sb.st_size - size < offset)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "host driver: import_fd(fd=%d, offset=%zu, size=%s): the fd is not "
                             "a file holding that range (%lld bytes)",
                             fd, offset, _expseg_format_size(b, size), (long long)sb.st_size);
  if (offset % os_page())
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "host driver: import_fd(fd=%d, offset=%zu): the offset is not a "
                             "multiple of the OS page (%zu)",
                             fd, offset, os_page());
  int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return sys_fail("import_fd", errno, "dup");
  uint64_t user = 0;
  pthread_mutex_lock(&h->mu);
  expseg_status s = _expseg_arenas_adopt(h->arenas, d, offset, &user);
  if (s == EXPSEG_OK) {
    s = _expseg_ledger_chunk_new(h->ledger, size, user, true, out);
    if (s) _expseg_arenas_drop(h->arenas, user); /* closes d */
  } else {
    close(d);
  }
  pthread_mutex_unlock(&h->mu);
  return s;
}

static expseg_status host_has_access(void *st, uintptr_t addr, size_t size, int device,
                                     int *state) {
  host_t *h = st;
  return _expseg_access_query(&h->mu, h->access, addr, size, device, state);
}

/* Faults in the pages of [dev, dev + size) in one call before a copy writes them (Linux
 * 5.14+ MADV_POPULATE_WRITE; elsewhere, or refused, the copy faults them one by one). A
 * freshly created chunk has no pages: a wake's copy-back into it otherwise takes one page
 * fault per 4 KiB, measured 3 to 4 times slower than populating first (docs/benchmarks.md). */
static void populate(uintptr_t dev, size_t size) {
#ifdef MADV_POPULATE_WRITE
  const uintptr_t page = os_page(), lo = dev & ~(page - 1), hi = (dev + size + page - 1) & ~(page - 1);
  (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
#else
  (void)dev, (void)size;
#endif
}

/* The data-check hook: the range must be mapped (ledger) and accessible to the device. */
static expseg_status host_copy(void *st, uintptr_t dev, void *host, size_t size, bool to_device) {
  host_t *h = st;
  const char *what = to_device ? "copy_in" : "copy_out";
  pthread_mutex_lock(&h->mu);
  expseg_status s = _expseg_ledger_check_mapped(h->ledger, dev, size, what);
  pthread_mutex_unlock(&h->mu);
  if (s) return s;
  int state = 0;
  s = _expseg_access_query(&h->mu, h->access, dev, size, h->device, &state);
  if (s) return s;
  if (state != 2)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "host driver: %s(0x%llx, %zu): device %d has no access to every "
                             "byte of the range (set_access first)",
                             what, (unsigned long long)dev, size, h->device);
  if (to_device) {
    populate(dev, size);
    memcpy((void *)dev, host, size);
  } else
    memcpy(host, (const void *)dev, size);
  return EXPSEG_OK;
}

static size_t host_granularity(void *st) { return ((host_t *)st)->o.granularity; }

static void host_mem_info(void *st, size_t *free_bytes, size_t *total_bytes) {
  host_t *h = st;
  pthread_mutex_lock(&h->mu);
  *free_bytes = h->o.capacity - h->in_use;
  *total_bytes = h->o.capacity;
  pthread_mutex_unlock(&h->mu);
}


static void drop_resv(void *ctx, uintptr_t addr, size_t size) {
  (void)ctx;
  munmap((void *)addr, size);
}

static void host_destroy(void *st) {
  host_t *h = st;
  if (!h) return;
  /* Whatever the caller left behind goes: live reservations (with their mappings) are
   * unmapped, the arenas and imported chunks closed. */
  if (h->ledger) {
    _expseg_ledger_foreach_resv(h->ledger, drop_resv, NULL);
    _expseg_ledger_free(h->ledger);
  }
  _expseg_arenas_free(h->arenas);
  _expseg_access_free(h->access);
  _expseg_smodel_free(h->streams);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

static const expseg_vmm_ops_t host_ops = {
    .name = "host",
    .reserve = host_reserve,
    .unreserve = host_unreserve,
    .create = host_create,
    .release = host_release,
    .map = host_map,
    .unmap = host_unmap,
    .set_access = host_set_access,
    EXPSEG_MODELLED_OPS,
    .export_fd = host_export_fd,
    .import_fd = host_import_fd,
    .granularity = host_granularity,
    .mem_info = host_mem_info,
    .destroy = host_destroy,
    .has_access = host_has_access,
    .copy = host_copy,
};

expseg_status _expseg_host_new(const expseg_host_opts_t *o, int device, expseg_vmm_t **out) {
  if (!o || !out)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "host driver: NULL options or out");
  *out = NULL;
  expseg_host_opts_t opt = *o;
  size_t page = os_page();
  char b[32];
  size_t g = opt.granularity;
  if (g < page || (g & (g - 1)) || g > (1ull << 30))
    return _expseg_error_set(EXPSEG_ERR_CONFIG,
                             "host driver: granularity=%zu: expected a power of two from the OS "
                             "page (%zu) to 1G",
                             g, page);
  if (opt.capacity == 0) {
    long pages = sysconf(_SC_PHYS_PAGES);
    uint64_t half = pages > 0 ? (uint64_t)pages * page / 2 : (8ull << 30);
    opt.capacity = half < (8ull << 30) ? (size_t)half : (size_t)(8ull << 30);
    opt.capacity &= ~(g - 1);
  }
  if (opt.capacity < g)
    return _expseg_error_set(EXPSEG_ERR_CONFIG,
                             "host driver: capacity=%zu: expected at least the granularity (%s)",
                             opt.capacity, _expseg_format_size(b, g));
  if (opt.numa_node >= 0) {
    int n = _expseg_topo_numa_count();
    if (!_expseg_topo_node_exists(opt.numa_node))
      return _expseg_error_set(EXPSEG_ERR_CONFIG,
                               "host driver: numa=%d: this machine has %d NUMA node(s) "
                               "(accepted: 0..%d)",
                               opt.numa_node, n, n - 1);
  }
  host_t *h = calloc(1, sizeof *h);
  if (!h) return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "host driver: out of host memory");
  pthread_mutex_init(&h->mu, NULL);
  h->o = opt;
  h->ledger = _expseg_ledger_new("host", g);
  h->streams = _expseg_smodel_new("host");
  h->arenas = _expseg_arenas_new(opt.capacity, g);
  h->access = _expseg_access_new();
  h->device = device;
  if (!h->ledger || !h->streams || !h->arenas || !h->access) {
    host_destroy(h);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "host driver: out of host memory");
  }
  return _expseg_vmm_wrap(&host_ops, h, device, out);
}
