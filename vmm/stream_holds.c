/* SPDX-License-Identifier: Apache-2.0 */
/* stream_holds.c: the hold_stream slots and the destroyed-stream set of the cuda driver
 * (stream_holds.h says why they live apart from vmm/cuda.c). */
#include "stream_holds.h"

#include "error.h"

#include <string.h>

void _expseg_holds_init(_expseg_holds_t *h) {
  memset(h, 0, sizeof *h);
  pthread_mutex_init(&h->mu, NULL);
}

void _expseg_holds_fini(_expseg_holds_t *h) {
  pthread_mutex_destroy(&h->mu);
  _expseg_map_free(&h->retired);
}

int _expseg_holds_slot(const _expseg_holds_t *h, expseg_stream s) {
  for (int i = 0; i < h->n; i++)
    if (h->slot[i].stream == s) return i;
  return -1;
}

bool _expseg_holds_held(_expseg_holds_t *h, expseg_stream s) {
  if (__atomic_load_n(&h->held_now, __ATOMIC_ACQUIRE) == 0) return false;
  pthread_mutex_lock(&h->mu);
  int i = _expseg_holds_slot(h, s);
  bool held = i >= 0 && h->slot[i].held;
  pthread_mutex_unlock(&h->mu);
  return held;
}

void _expseg_holds_release(_expseg_holds_t *h, int i) {
  if (!h->slot[i].held) return;
  __atomic_store_n(&h->page[i], h->slot[i].gen, __ATOMIC_RELEASE);
  h->slot[i].held = false;
  __atomic_sub_fetch(&h->held_now, 1, __ATOMIC_RELEASE);
}

bool _expseg_holds_retired(_expseg_holds_t *h, expseg_stream s, bool remove) {
  pthread_mutex_lock(&h->mu);
  bool found = remove ? _expseg_map_take(&h->retired, s, NULL)
                      : _expseg_map_get(&h->retired, s) != NULL;
  pthread_mutex_unlock(&h->mu);
  return found;
}

expseg_status _expseg_holds_retire(_expseg_holds_t *h, expseg_stream s) {
  pthread_mutex_lock(&h->mu);
  bool ok = _expseg_map_put(&h->retired, s, 1);
  pthread_mutex_unlock(&h->mu);
  return ok ? EXPSEG_OK
            : _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "cuda driver: out of host memory");
}
