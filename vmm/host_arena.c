/* SPDX-License-Identifier: Apache-2.0 */
/* host_arena.c: where the host backend's chunks live, with no open file per chunk.
 *
 * A chunk is a range of an "arena": a large sparse memfd (ftruncate'd to max(capacity, 1 GiB),
 * so it costs nothing until touched). Each arena keeps its free ranges (ranges.c: sorted,
 * coalesced, granularity-aligned); claim is first fit over the arenas in order, and a new
 * arena is opened only when none has room. Giving a range back punches a hole in the file
 * (fallocate PUNCH_HOLE|KEEP_SIZE), which returns its pages to the OS, then frees the range.
 * A range that was exported is never punched nor reused: another process may still map it
 * (its pages go when the last process closes the arena). An imported chunk is a slot of its
 * own holding the importer's dup of the fd and the offset it starts at; it is closed when
 * the chunk is released. So a process holds one descriptor per arena (usually one) plus one
 * per imported chunk, whatever the number of chunks.
 *
 * A chunk's ledger word packs (slot << 48) | offset | exported: offsets are below 2^48 and
 * granularity-aligned, so bit 0 is free to mark a range once exported. Not thread-safe:
 * host.c holds its mutex around every call. */
#include "vmm_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define OFF_BITS 48
#define OFF_MASK ((UINT64_C(1) << OFF_BITS) - 1)
#define EXPORTED UINT64_C(1)
#define MAX_SLOTS 65535u
#define MIN_ARENA (UINT64_C(1) << 30)

typedef struct {
  int fd;         /* -1: free slot */
  bool imported;  /* one imported chunk: no free ranges */
  size_t base;    /* imported: where the chunk starts in the file */
  expseg_ranges_t free;
} arena_t;

struct expseg_arenas_s {
  arena_t *a;
  size_t n, cap;
  size_t arena_size, g;
};

static uint64_t pack(size_t slot, size_t off) { return ((uint64_t)slot << OFF_BITS) | off; }
static size_t slot_of(uint64_t user) { return (size_t)(user >> OFF_BITS); }
static size_t off_of(uint64_t user) { return (size_t)(user & OFF_MASK & ~EXPORTED); }

static expseg_status sys_err(const char *call, const char *what, int err) {
  return _expseg_error_set(err == ENOMEM || err == ENOSPC ? EXPSEG_ERR_OUT_OF_MEMORY
                                                          : EXPSEG_ERR_DRIVER,
                           "host driver: %s: %s failed: %s", call, what, strerror(err));
}

expseg_arenas_t *_expseg_arenas_new(size_t capacity, size_t granularity) {
  expseg_arenas_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  uint64_t size = capacity > MIN_ARENA ? capacity : MIN_ARENA;
  if (size > (OFF_MASK >> 1)) size = OFF_MASK >> 1;
  s->arena_size = (size_t)((size + granularity - 1) & ~(uint64_t)(granularity - 1));
  s->g = granularity;
  return s;
}

void _expseg_arenas_free(expseg_arenas_t *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) {
    if (s->a[i].fd >= 0) close(s->a[i].fd);
    _expseg_ranges_free(&s->a[i].free);
  }
  free(s->a);
  free(s);
}

/* A free slot (fd -1), growing the table; SIZE_MAX with the message set and *st the status
 * when out of slots (the device's memory: out of memory) or of host memory for the table. */
static size_t new_slot(expseg_arenas_t *s, const char *call, expseg_status *st) {
  for (size_t i = 0; i < s->n; i++)
    if (s->a[i].fd < 0) return i;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 8;
    if (cap > MAX_SLOTS) cap = MAX_SLOTS;
    if (cap == s->cap) {
      *st = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                              "host driver: %s: all %u slots for arenas and imported chunks "
                              "are in use",
                              call, MAX_SLOTS);
      return SIZE_MAX;
    }
    arena_t *t = realloc(s->a, cap * sizeof *t);
    if (!t) {
      *st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                              "host driver: %s: out of host memory for the arena table", call);
      return SIZE_MAX;
    }
    s->a = t;
    s->cap = cap;
  }
  memset(&s->a[s->n], 0, sizeof *s->a);
  s->a[s->n].fd = -1;
  return s->n++;
}

expseg_status _expseg_arenas_claim(expseg_arenas_t *s, size_t size, uint64_t *user) {
  for (size_t i = 0; i < s->n; i++) {
    if (s->a[i].fd < 0 || s->a[i].imported) continue;
    uint64_t off = 0;
    int got = _expseg_ranges_take(&s->a[i].free, size, 1, &off);
    if (got < 0)
      return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                               "host driver: create: out of host memory for the free ranges");
    if (got > 0) {
      *user = pack(i, (size_t)off);
      return EXPSEG_OK;
    }
  }
  size_t fsize = size > s->arena_size ? size : s->arena_size;
  if (fsize > OFF_MASK)
    return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                             "host driver: create: %zu bytes is more than an arena can hold",
                             size);
  expseg_status st = EXPSEG_OK;
  size_t slot = new_slot(s, "create", &st);
  if (slot == SIZE_MAX) return st;
  int fd = memfd_create("expseg-arena", MFD_CLOEXEC);
  if (fd < 0) return sys_err("create", "memfd_create", errno);
  if (ftruncate(fd, (off_t)fsize) != 0) {
    int e = errno;
    close(fd);
    return sys_err("create", "ftruncate", e);
  }
  arena_t *a = &s->a[slot];
  a->fd = fd;
  if (fsize > size && !_expseg_ranges_put(&a->free, size, fsize - size)) {
    close(fd);
    a->fd = -1;
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "host driver: create: out of host memory for the free ranges");
  }
  *user = pack(slot, 0);
  return EXPSEG_OK;
}

uint64_t _expseg_arenas_mark_exported(uint64_t user) { return user | EXPORTED; }

expseg_status _expseg_arenas_give_back(expseg_arenas_t *s, uint64_t user, size_t size) {
  arena_t *a = &s->a[slot_of(user)];
  size_t off = off_of(user);
  if (user & EXPORTED) return EXPSEG_OK; /* retired: another process may map it still */
  /* Zero-filled and given back to the OS; a hole costs nothing. */
  if (fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)size) != 0)
    return sys_err("release", "fallocate(PUNCH_HOLE)", errno);
  if (!_expseg_ranges_put(&a->free, off, size))
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "host driver: release: out of host memory for the free ranges");
  return EXPSEG_OK;
}

expseg_status _expseg_arenas_adopt(expseg_arenas_t *s, int fd, size_t base, uint64_t *user) {
  expseg_status st = EXPSEG_OK;
  size_t slot = new_slot(s, "import_fd", &st);
  if (slot == SIZE_MAX) return st;
  s->a[slot].fd = fd;
  s->a[slot].imported = true;
  s->a[slot].base = base;
  *user = pack(slot, 0);
  return EXPSEG_OK;
}

void _expseg_arenas_drop(expseg_arenas_t *s, uint64_t user) {
  arena_t *a = &s->a[slot_of(user)];
  close(a->fd);
  a->fd = -1;
  a->imported = false;
}

int _expseg_arenas_fd(const expseg_arenas_t *s, uint64_t user, size_t *offset) {
  const arena_t *a = &s->a[slot_of(user)];
  *offset = a->imported ? a->base : off_of(user);
  return a->fd;
}
