/* SPDX-License-Identifier: Apache-2.0 */
/* access.c: which devices may access which mapped ranges, as the host and sim drivers
 * record it (a test checks peer access through _expseg_vmm_has_access).
 *
 * One sorted, coalesced list of address intervals per device ordinal that was ever granted
 * access. grant = union, revoke = difference, unmap = difference on every device (a mapping
 * that goes takes its access rights with it, as cuMemUnmap does). Lists are short: grants
 * come one per newly mapped range and merge with their neighbours. Not thread-safe: the
 * backend holds its mutex around every call. */
#include "vmm_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  uintptr_t lo, hi; /* [lo, hi) */
} ival_t;

typedef struct {
  int device;
  ival_t *v;
  size_t n, cap;
} dev_list_t;

struct expseg_access_s {
  dev_list_t *d;
  size_t n, cap;
};

expseg_access_t *_expseg_access_new(void) { return calloc(1, sizeof(expseg_access_t)); }

void _expseg_access_free(expseg_access_t *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) free(s->d[i].v);
  free(s->d);
  free(s);
}

static dev_list_t *list_of(expseg_access_t *s, int device, bool make) {
  for (size_t i = 0; i < s->n; i++)
    if (s->d[i].device == device) return &s->d[i];
  if (!make) return NULL;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 4;
    dev_list_t *t = realloc(s->d, cap * sizeof *t);
    if (!t) return NULL;
    s->d = t;
    s->cap = cap;
  }
  s->d[s->n] = (dev_list_t){.device = device};
  return &s->d[s->n++];
}

static bool reserve_room(dev_list_t *l, size_t more) {
  if (l->n + more <= l->cap) return true;
  size_t cap = l->cap ? l->cap * 2 : 8;
  while (cap < l->n + more) cap *= 2;
  ival_t *t = realloc(l->v, cap * sizeof *t);
  if (!t) return false;
  l->v = t;
  l->cap = cap;
  return true;
}

/* First interval whose hi >= lo (touching or overlapping candidates start there). */
static size_t first_reaching(const dev_list_t *l, uintptr_t lo) {
  size_t a = 0, b = l->n;
  while (a < b) {
    size_t m = (a + b) / 2;
    if (l->v[m].hi < lo) a = m + 1;
    else b = m;
  }
  return a;
}

bool _expseg_access_grant(expseg_access_t *s, uintptr_t addr, size_t size, int device) {
  dev_list_t *l = list_of(s, device, true);
  if (!l || !reserve_room(l, 1)) return false;
  uintptr_t lo = addr, hi = addr + size;
  size_t i = first_reaching(l, lo), j = i;
  while (j < l->n && l->v[j].lo <= hi) { /* overlapping or adjacent: merge */
    if (l->v[j].lo < lo) lo = l->v[j].lo;
    if (l->v[j].hi > hi) hi = l->v[j].hi;
    j++;
  }
  /* [i, j) collapse into one interval */
  if (j == i) memmove(&l->v[i + 1], &l->v[i], (l->n - i) * sizeof *l->v), l->n++;
  else if (j > i + 1) memmove(&l->v[i + 1], &l->v[j], (l->n - j) * sizeof *l->v), l->n -= j - i - 1;
  l->v[i] = (ival_t){lo, hi};
  return true;
}

static bool cut(dev_list_t *l, uintptr_t lo, uintptr_t hi) {
  if (!reserve_room(l, 1)) return false;
  size_t i = first_reaching(l, lo + 1);
  while (i < l->n && l->v[i].lo < hi) {
    ival_t *v = &l->v[i];
    if (v->lo < lo && v->hi > hi) { /* split in two */
      memmove(&l->v[i + 1], &l->v[i], (l->n - i) * sizeof *l->v);
      l->n++;
      l->v[i].hi = lo;
      l->v[i + 1].lo = hi;
      return true;
    }
    if (v->lo < lo) {
      v->hi = lo;
      i++;
    } else if (v->hi > hi) {
      v->lo = hi;
      i++;
    } else {
      memmove(&l->v[i], &l->v[i + 1], (l->n - i - 1) * sizeof *l->v);
      l->n--;
    }
  }
  return true;
}

bool _expseg_access_revoke(expseg_access_t *s, uintptr_t addr, size_t size, int device) {
  dev_list_t *l = list_of(s, device, false);
  return l ? cut(l, addr, addr + size) : true;
}

bool _expseg_access_unmap(expseg_access_t *s, uintptr_t addr, size_t size) {
  bool ok = true;
  for (size_t i = 0; i < s->n; i++) ok = cut(&s->d[i], addr, addr + size) && ok;
  return ok;
}

bool _expseg_access_covers(expseg_access_t *s, uintptr_t addr, size_t size, int device) {
  dev_list_t *l = list_of(s, device, false);
  if (!l) return false;
  size_t i = first_reaching(l, addr + 1);
  return i < l->n && l->v[i].lo <= addr && l->v[i].hi >= addr + size;
}

bool _expseg_access_any(expseg_access_t *s, uintptr_t addr, size_t size, int device) {
  dev_list_t *l = list_of(s, device, false);
  if (!l) return false;
  size_t i = first_reaching(l, addr + 1);
  return i < l->n && l->v[i].lo < addr + size;
}

expseg_status _expseg_access_apply(expseg_access_t *s, const char *backend, uintptr_t addr,
                                   size_t size, int device, int owner) {
  bool ok;
  if (device >= 0) {
    ok = _expseg_access_grant(s, addr, size, device);
  } else {
    int d = EXPSEG_VMM_REVOKED_DEVICE(device);
    if (d == owner)
      return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                               "%s driver: set_access: device %d owns the memory; its own "
                               "access cannot be revoked (unmap instead)",
                               backend, d);
    ok = _expseg_access_revoke(s, addr, size, d);
  }
  return ok ? EXPSEG_OK
            : _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                                "%s driver: set_access: out of host memory for the access record",
                                backend);
}

expseg_status _expseg_access_query(pthread_mutex_t *mu, expseg_access_t *s, uintptr_t addr,
                                   size_t size, int device, int *state) {
  pthread_mutex_lock(mu);
  *state = _expseg_access_covers(s, addr, size, device) ? 2
           : _expseg_access_any(s, addr, size, device)  ? 1
                                                        : 0;
  pthread_mutex_unlock(mu);
  return EXPSEG_OK;
}
