/* SPDX-License-Identifier: Apache-2.0 */
/* expseg_torch_host.c: the pinned host pool of libexpseg_torch.so, for programs that take
 * pinned host memory from expseg through the Python helper (expseg.host_alloc) and want it
 * in their snapshots, as PyTorch 2.14 adds its pinned host allocator to a snapshot.
 *
 * One pool per process (PyTorch's pinned allocator is process-wide too), created by the first
 * expseg_torch_host_alloc with expseg_host_create(NULL, device, NULL): the driver and the
 * configuration from the environment, as the device allocators; the device of that first
 * call places it on its NUMA node. It lives until the process ends. Its history setting is
 * kept, so one given before the pool exists applies when it is created. Snapshots of the
 * plug (expseg_torch_snapshot_dump*) carry the pool's host_segments and host_traces once the
 * pool exists; before that, as PyTorch without pinned memory, neither key is written.
 * Failures keep their message as the device calls do, under device -1. */
#include "expseg_torch.h"
#include "expseg_torch_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

static _Atomic(expseg_host_pool *) pool;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER; /* creation and the setting */
static bool hist_on;
static size_t hist_max;
static unsigned hist_flags;

/* A failure's status, its message kept for device -1 (prefixed with the call). */
static int host_fail(const char *call, expseg_status st) {
  char m[512];
  snprintf(m, sizeof m, "%s: %s", call, expseg_last_error());
  _expseg_torch_fail_msg(-1, m);
  return st;
}

expseg_host_pool *_expseg_torch_host_existing(void) {
  return atomic_load_explicit(&pool, memory_order_acquire);
}

/* The pool, created on first use with the history setting in force. */
static int host_get(int device, expseg_host_pool **out) {
  *out = _expseg_torch_host_existing();
  if (*out) return EXPSEG_OK;
  pthread_mutex_lock(&pool_mu);
  expseg_host_pool *h = atomic_load_explicit(&pool, memory_order_relaxed);
  expseg_status st = EXPSEG_OK;
  if (!h) {
    st = expseg_host_create(NULL, device, NULL, &h);
    if (st == EXPSEG_OK && hist_on) {
      st = expseg_host_record_history(h, true, hist_max, hist_flags);
      if (st != EXPSEG_OK) {
        expseg_host_destroy(h);
        h = NULL;
      }
    }
    if (st == EXPSEG_OK) atomic_store_explicit(&pool, h, memory_order_release);
  }
  pthread_mutex_unlock(&pool_mu);
  *out = h;
  return st == EXPSEG_OK ? EXPSEG_OK : host_fail("expseg_torch_host_alloc: no pinned host pool", st);
}

int expseg_torch_host_alloc(int device, size_t size, void **out) {
  if (!out) {
    _expseg_torch_fail_msg(-1, "expseg_torch_host_alloc: out is NULL");
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  *out = NULL;
  if (device < 0 || device >= EXPSEG_TORCH_MAX_DEVICES) {
    char m[160];
    snprintf(m, sizeof m, "expseg_torch_host_alloc: device %d: expected 0 <= device < %d",
             device, EXPSEG_TORCH_MAX_DEVICES);
    _expseg_torch_fail_msg(-1, m);
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  expseg_host_pool *h = NULL;
  int st = host_get(device, &h);
  if (st != EXPSEG_OK) return st;
  st = expseg_host_malloc(h, size, out);
  return st == EXPSEG_OK ? EXPSEG_OK : host_fail("expseg_torch_host_alloc", st);
}

int expseg_torch_host_free(void *ptr) {
  if (!ptr) return EXPSEG_OK;
  expseg_host_pool *h = _expseg_torch_host_existing();
  if (!h) {
    char m[160];
    snprintf(m, sizeof m, "expseg_torch_host_free(%p): no pinned host memory was allocated",
             ptr);
    _expseg_torch_fail_msg(-1, m);
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  expseg_status st = expseg_host_free(h, ptr);
  return st == EXPSEG_OK ? EXPSEG_OK : host_fail("expseg_torch_host_free", st);
}

int expseg_torch_host_record_history(int enabled, size_t max_entries, unsigned flags) {
  if (enabled && max_entries == 0) {
    _expseg_torch_fail_msg(-1, "expseg_torch_host_record_history: max_entries 0: expected at "
                               "least 1");
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&pool_mu); /* held: a pool created meanwhile sees the new setting */
  hist_on = enabled != 0;
  hist_max = enabled ? max_entries : 0;
  hist_flags = enabled ? flags : 0;
  expseg_host_pool *h = atomic_load_explicit(&pool, memory_order_relaxed);
  expseg_status st = h ? expseg_host_record_history(h, enabled != 0, hist_max, hist_flags)
                       : EXPSEG_OK;
  pthread_mutex_unlock(&pool_mu);
  return st == EXPSEG_OK ? EXPSEG_OK : host_fail("expseg_torch_host_record_history", st);
}

int expseg_torch_host_used(void) { return _expseg_torch_host_existing() != NULL; }

int expseg_torch_host_stat(const char *key, int64_t *value) {
  expseg_host_pool *h = _expseg_torch_host_existing();
  if (!h) {
    _expseg_torch_fail_msg(-1, "expseg_torch_host_stat: no pinned host memory was allocated");
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  expseg_status st = expseg_host_stat(h, key, value);
  return st == EXPSEG_OK ? EXPSEG_OK : host_fail("expseg_torch_host_stat", st);
}

int expseg_torch_host_empty_cache(void) {
  expseg_host_pool *h = _expseg_torch_host_existing();
  expseg_status st = h ? expseg_host_empty_cache(h) : EXPSEG_OK;
  return st == EXPSEG_OK ? EXPSEG_OK : host_fail("expseg_torch_host_empty_cache", st);
}
