/* SPDX-License-Identifier: Apache-2.0 */
/* vmm_impl.h: internals shared by the files of vmm/ only (never included outside vmm/).
 *
 * - the wrapper's accounting step (vmm.c), reused by the fault wrapper to keep its inner
 *   driver's counters meaningful;
 * - the stream/event model that host and sim share (stream_model.c);
 * - the ledger (ledger.c): reservations, chunks and mappings with every precondition of
 *   vmm.h checked in O(log n); sim is a ledger plus a fake address space, host checks each
 *   call against one before it touches mmap. */
#ifndef EXPSEG_VMM_IMPL_H
#define EXPSEG_VMM_IMPL_H

#include "dec.h" /* base/: _expseg_dec_u64, the one decimal reader */
#include "error.h"
#include "vmm.h"

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- vmm.c ---- */

/* Counts one call of kind c with result s; on success moves the gauges by `bytes`
 * (reserve/unreserve: reserved VA, create/import/release: chunks, map/unmap: mapped bytes,
 * event_create/destroy: events). */
void _expseg_vmm_account(expseg_vmm_t *v, expseg_vmm_call c, expseg_status s, uint64_t bytes);

/* ---- stream_model.c: modelled streams and events (host, sim) ---- */

typedef struct expseg_smodel_s expseg_smodel_t;

expseg_smodel_t *_expseg_smodel_new(const char *backend_name);
void _expseg_smodel_free(expseg_smodel_t *m);
expseg_status _expseg_smodel_event_create(expseg_smodel_t *m, expseg_vmm_event *ev);
expseg_status _expseg_smodel_event_destroy(expseg_smodel_t *m, expseg_vmm_event ev);
expseg_status _expseg_smodel_event_record(expseg_smodel_t *m, expseg_vmm_event ev,
                                           expseg_stream s);
expseg_status _expseg_smodel_event_query(expseg_smodel_t *m, expseg_vmm_event ev, bool *done);
expseg_status _expseg_smodel_event_synchronize(expseg_smodel_t *m, expseg_vmm_event ev);
expseg_status _expseg_smodel_stream_synchronize(expseg_smodel_t *m, expseg_stream s);
expseg_status _expseg_smodel_device_synchronize(expseg_smodel_t *m);
void _expseg_smodel_hold(expseg_smodel_t *m, expseg_stream s, bool hold);

/* The same, shaped as expseg_vmm_ops_t entries, for a backend whose state struct begins
 * with its expseg_smodel_t pointer (host and sim: checked with a static assertion there),
 * so both put these straight into their ops tables. */
expseg_status _expseg_modelled_event_create(void *st, expseg_vmm_event *ev);
expseg_status _expseg_modelled_event_destroy(void *st, expseg_vmm_event ev);
expseg_status _expseg_modelled_event_record(void *st, expseg_vmm_event ev, expseg_stream s);
expseg_status _expseg_modelled_event_query(void *st, expseg_vmm_event ev, bool *done);
expseg_status _expseg_modelled_event_synchronize(void *st, expseg_vmm_event ev);
expseg_status _expseg_modelled_stream_synchronize(void *st, expseg_stream s);
expseg_status _expseg_modelled_device_synchronize(void *st);
void _expseg_modelled_hold_stream(void *st, expseg_stream s, bool hold);
uint64_t _expseg_modelled_now_ns(void *st);
/* Those entries, the clock and the pinned host memory (vmm/host_pinned.c) as one part of an
 * expseg_vmm_ops_t initializer: what the host and sim tables share, written once. */
#define EXPSEG_MODELLED_OPS                                     \
  .event_create = _expseg_modelled_event_create,                \
  .event_destroy = _expseg_modelled_event_destroy,              \
  .event_record = _expseg_modelled_event_record,                \
  .event_query = _expseg_modelled_event_query,                  \
  .event_synchronize = _expseg_modelled_event_synchronize,      \
  .stream_synchronize = _expseg_modelled_stream_synchronize,    \
  .now_ns = _expseg_modelled_now_ns,                            \
  .hold_stream = _expseg_modelled_hold_stream,                  \
  .device_synchronize = _expseg_modelled_device_synchronize,    \
  .host_alloc = _expseg_pinned_alloc,                           \
  .host_free = _expseg_pinned_free

/* ---- ledger.c: bookkeeping of reservations, chunks and mappings (not thread-safe) ---- */

typedef struct expseg_ledger_s expseg_ledger_t;

expseg_ledger_t *_expseg_ledger_new(const char *backend_name, size_t granularity);
void _expseg_ledger_free(expseg_ledger_t *l);
/* Adds a reservation (already known not to overlap another one). OOM when out of memory. */
expseg_status _expseg_ledger_reserve(expseg_ledger_t *l, uintptr_t addr, size_t size);
/* Checks that (addr, size) is exactly one reservation with no mapping in it; removes it
 * when commit. */
expseg_status _expseg_ledger_unreserve(expseg_ledger_t *l, uintptr_t addr, size_t size,
                                       bool commit);
/* New chunk of `size` bytes; `user` is the backend's own word (host: its arena range). */
expseg_status _expseg_ledger_chunk_new(expseg_ledger_t *l, size_t size, uint64_t user,
                                       bool imported, expseg_vmm_handle *h);
/* Replaces a live chunk's user word (host: marks it exported). */
expseg_status _expseg_ledger_chunk_set_user(expseg_ledger_t *l, expseg_vmm_handle h,
                                            uint64_t user);
/* Looks a live chunk up: its size, user word and whether it was imported. */
expseg_status _expseg_ledger_chunk_get(expseg_ledger_t *l, expseg_vmm_handle h, size_t *size,
                                       uint64_t *user, bool *imported);
/* Checks that the chunk is live and mapped nowhere; forgets it when commit. */
expseg_status _expseg_ledger_chunk_release(expseg_ledger_t *l, expseg_vmm_handle h,
                                           bool commit);
/* Checks the map preconditions and records the mapping (OOM when out of memory). */
expseg_status _expseg_ledger_map(expseg_ledger_t *l, uintptr_t addr, size_t size,
                                 expseg_vmm_handle h, size_t offset);
/* Checks that [addr, addr+size) is exactly a union of whole mappings in one reservation;
 * forgets them when commit. */
expseg_status _expseg_ledger_unmap(expseg_ledger_t *l, uintptr_t addr, size_t size, bool commit);
/* Checks that every byte of [addr, addr+size) is mapped, inside one reservation. */
expseg_status _expseg_ledger_check_mapped(expseg_ledger_t *l, uintptr_t addr, size_t size,
                                          const char *call);
/* Live reservations (for destroy: the backend unmaps what is left). Calls fn on each. */
void _expseg_ledger_foreach_resv(expseg_ledger_t *l,
                                 void (*fn)(void *ctx, uintptr_t addr, size_t size), void *ctx);
size_t _expseg_ledger_mapping_count(const expseg_ledger_t *l);

/* ---- ranges.c: free ranges of a space, sorted and coalesced (sim's addresses, arenas) ---- */

typedef struct expseg_range_s {
  uint64_t start, len;
} expseg_range_t;

typedef struct expseg_ranges_s {
  expseg_range_t *r; /* sorted by start, never adjacent */
  size_t n, cap;
} expseg_ranges_t; /* zero-initialised = empty */

/* First fit: carves `size` bytes starting at a multiple of `align` (a power of two) out of
 * the first range that holds them. 1: taken (*start); 0: no range has room; -1: out of host
 * memory (nothing changed). */
int _expseg_ranges_take(expseg_ranges_t *s, uint64_t size, uint64_t align, uint64_t *start);
/* The same, last fit: the highest aligned `size` bytes of the last range that holds them. */
int _expseg_ranges_take_top(expseg_ranges_t *s, uint64_t size, uint64_t align, uint64_t *start);
/* Gives [start, start+len) back (it must not overlap a free range), merged with its
 * neighbours. false: out of host memory (nothing changed). Putting back what the last take
 * returned never fails. */
bool _expseg_ranges_put(expseg_ranges_t *s, uint64_t start, uint64_t len);
void _expseg_ranges_free(expseg_ranges_t *s);

/* ---- host_arena.c: the host backend's chunks as ranges of a few sparse memfds ---- */

typedef struct expseg_arenas_s expseg_arenas_t;

/* Arenas of max(capacity, 1 GiB) bytes (rounded to the granularity); NULL when out of memory. */
expseg_arenas_t *_expseg_arenas_new(size_t capacity, size_t granularity);
void _expseg_arenas_free(expseg_arenas_t *s); /* closes every arena and imported fd */
/* A free range of `size` bytes (first fit; opens a new arena when none has room). `user` is
 * the word to keep in the ledger. */
expseg_status _expseg_arenas_claim(expseg_arenas_t *s, size_t size, uint64_t *user);
/* The ledger word of a chunk once exported: its range is then never punched nor reused. */
uint64_t _expseg_arenas_mark_exported(uint64_t user);
/* Gives a claimed range back: pages returned to the OS (punched), range free again. Fails
 * with nothing changed. */
expseg_status _expseg_arenas_give_back(expseg_arenas_t *s, uint64_t user, size_t size);
/* An imported chunk: keeps fd (the caller's dup) and where the chunk starts in it. */
expseg_status _expseg_arenas_adopt(expseg_arenas_t *s, int fd, size_t base, uint64_t *user);
void _expseg_arenas_drop(expseg_arenas_t *s, uint64_t user); /* closes an adopted fd */
/* The file holding a chunk and the chunk's offset in it. */
int _expseg_arenas_fd(const expseg_arenas_t *s, uint64_t user, size_t *offset);

/* ---- access.c: which devices may access which ranges (host, sim; not thread-safe) ---- */

typedef struct expseg_access_s expseg_access_t;

expseg_access_t *_expseg_access_new(void); /* NULL when out of memory */
void _expseg_access_free(expseg_access_t *s);
/* false: out of host memory (nothing changed). */
bool _expseg_access_grant(expseg_access_t *s, uintptr_t addr, size_t size, int device);
bool _expseg_access_revoke(expseg_access_t *s, uintptr_t addr, size_t size, int device);
bool _expseg_access_unmap(expseg_access_t *s, uintptr_t addr, size_t size); /* all devices */
/* true: every byte of [addr, addr+size) is accessible from device. */
bool _expseg_access_covers(expseg_access_t *s, uintptr_t addr, size_t size, int device);
/* true: some byte is. */
bool _expseg_access_any(expseg_access_t *s, uintptr_t addr, size_t size, int device);
/* The ops entries host and sim share: set_access records grants and revocations (device
 * >= 0 grants, EXPSEG_VMM_REVOKE(d) revokes d), has_access answers from the record. */
expseg_status _expseg_access_apply(expseg_access_t *s, const char *backend, uintptr_t addr,
                                   size_t size, int device, int owner);
expseg_status _expseg_access_query(pthread_mutex_t *mu, expseg_access_t *s, uintptr_t addr,
                                   size_t size, int device, int *state); /* under mu */

#ifdef __cplusplus
}
#endif
#endif /* EXPSEG_VMM_IMPL_H */
