/* SPDX-License-Identifier: Apache-2.0 */
/* peer.c: access to the allocator's memory from peer devices.
 *
 * With virtual memory management, cudaDeviceEnablePeerAccess does not make a mapping
 * visible to another device: each mapped range needs cuMemSetAccess for that device. The
 * allocator keeps a set of peers (a->peers, one bit per ordinal 0..63). Enabling a peer
 * grants it every range mapped now, one set_access per maximal mapped range: a classic
 * segment, a run of mapped pages of an expandable segment, an imported allocation. From then
 * on every new mapping grants it too (map_pages and grow_classic call _expseg_peers_grant
 * right after the owner's set_access), so page moves and page-cache re-maps, which go
 * through map_pages, keep the peers' access. A sleeping segment's layout is not memory held:
 * only the chunks its region's sleep records say are mapped (while the bytes are copied out
 * or back, or left by a sleep the driver refused part-way) are walked, one range per chunk.
 * Disabling revokes the same ranges. A failure part-way is undone, so the set and the
 * mappings always agree. Everything here runs under the allocator's lock. */
#include "internal.h"
#include "sleep.h"

enum { MAX_PEER = 63 };

/* grant: device >= 0; revoke: EXPSEG_VMM_REVOKE(device). */
typedef struct {
  expseg_allocator *a;
  int arg;
  size_t done; /* ranges changed so far */
  size_t limit; /* stop after this many (undo), SIZE_MAX = all */
} walk_t;

static expseg_status one(void *ctx, uintptr_t addr, size_t size) {
  walk_t *w = ctx;
  if (w->done >= w->limit) return EXPSEG_OK;
  expseg_status st = _expseg_vmm_set_access_dev(w->a->drv, addr, size, w->arg);
  if (st == EXPSEG_OK) w->done++;
  return st;
}

/* Calls fn on every mapped range of the allocator, stopping at the first failure. */
static expseg_status each_range(expseg_allocator *a, walk_t *w) {
  expseg_status st = EXPSEG_OK;
  for (segment_t *s = a->segments; s && st == EXPSEG_OK; s = s->next_all) {
    if (s->asleep) continue; /* below, from its region's records */
    if (!s->expandable) {
      st = one(w, s->base, s->va_size);
      continue;
    }
    size_t i = 0, n = s->pages_cap;
    while (i < n && st == EXPSEG_OK) {
      if (!s->pages[i].mapped) {
        i++;
        continue;
      }
      size_t j = i;
      while (j < n && s->pages[j].mapped) j++;
      st = one(w, s->base + i * s->page, (j - i) * s->page);
      i = j;
    }
  }
  for (size_t r = 0; a->sleep && r < a->sleep->n && st == EXPSEG_OK; r++)
    for (size_t i = 0; i < a->sleep->r[r].n_segs && st == EXPSEG_OK; i++) {
      const sseg_t *g = &a->sleep->r[r].segs[i];
      for (size_t k = 0; g->s->asleep && k < g->n_chunks && st == EXPSEG_OK; k++)
        if (g->chunks[k].mapped) st = one(w, g->chunks[k].addr, g->chunks[k].size);
    }
  if (st == EXPSEG_OK && a->ipc) st = _expseg_ipc_foreach_import(a, one, w);
  return st;
}

static expseg_status check_peer(const expseg_allocator *a, int peer, const char *fn) {
  if (peer < 0 || peer > MAX_PEER || peer == a->device)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s(device %d): peer device %d: expected a device ordinal in "
                             "[0, %d] other than the allocator's own",
                             fn, a->device, peer, MAX_PEER);
  return EXPSEG_OK;
}

/* Applies arg to every range; on failure undoes the ranges done with undo_arg. */
static expseg_status apply_all(expseg_allocator *a, int arg, int undo_arg) {
  walk_t w = {a, arg, 0, SIZE_MAX};
  expseg_status st = each_range(a, &w);
  if (st == EXPSEG_OK) return EXPSEG_OK;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", expseg_last_error());
  walk_t u = {a, undo_arg, 0, w.done};
  (void)each_range(a, &u);
  return _expseg_error_set(st, "%s", msg);
}

/* Adds (enable) or removes the peer, granting or revoking every range. */
static expseg_status change_peer(expseg_allocator *a, int peer, bool enable, const char *fn) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s: the allocator is NULL", fn);
  expseg_status st = check_peer(a, peer, fn);
  if (st) return st;
  api_lock(a);
  uint64_t bit = UINT64_C(1) << peer;
  if (!(a->peers & bit) == enable) { /* else nothing to do */
    int grant = peer, revoke = EXPSEG_VMM_REVOKE(peer);
    /* a peer that does not exist or cannot access this device is refused now, not at the
     * next mapping (also when nothing is mapped yet) */
    st = enable ? _expseg_vmm_check_peer(a->drv, peer) : EXPSEG_OK;
    if (st == EXPSEG_OK) st = enable ? apply_all(a, grant, revoke) : apply_all(a, revoke, grant);
    if (st == EXPSEG_OK) a->peers = enable ? a->peers | bit : a->peers & ~bit;
    else _expseg_error_prefix("%s(device %d -> peer %d)", fn, a->device, peer);
  }
  api_unlock(a);
  return st;
}

expseg_status expseg_enable_peer_access(expseg_allocator *a, int peer_device) {
  return change_peer(a, peer_device, true, "expseg_enable_peer_access");
}

expseg_status expseg_disable_peer_access(expseg_allocator *a, int peer_device) {
  return change_peer(a, peer_device, false, "expseg_disable_peer_access");
}

expseg_status _expseg_peers_grant(expseg_allocator *a, uintptr_t addr, size_t size) {
  for (int p = 0; p <= MAX_PEER; p++) {
    if (!(a->peers & (UINT64_C(1) << p))) continue;
    expseg_status st = _expseg_vmm_set_access_dev(a->drv, addr, size, p);
    if (st != EXPSEG_OK) {
      _expseg_error_prefix("granting peer device %d access to a new mapping", p);
      return st; /* the caller unmaps the range, which takes every grant with it */
    }
  }
  return EXPSEG_OK;
}
