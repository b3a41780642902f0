/* SPDX-License-Identifier: Apache-2.0 */
/* stream_model.c: the stream and event model shared by the host and sim backends.
 *
 * Nothing runs on these "devices", so work completes the moment it is queued, except on a
 * stream a test holds (_expseg_vmm_hold_stream). Each held stream has a hold generation,
 * bumped each time the hold is taken. Recording an event on a held stream stores the
 * stream and that generation; the event is incomplete while the stream is still held in
 * the same generation, and complete once the hold is released (later holds have a new
 * generation, so they do not un-complete old events). Synchronizing on something that
 * can only complete when a hold is released returns EXPSEG_ERR_DRIVER instead of hanging.
 *
 * Event ids are (generation << 32) | (slot + 1): O(1) lookup, never 0, and a destroyed id
 * is recognised as stale. Held streams live in a small array (tests hold a handful). */
#include "vmm_impl.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
  expseg_stream stream;
  uint64_t gen; /* bumped on every hold */
  bool held;
} held_t;

typedef struct {
  uint32_t gen;       /* must equal the id's high half */
  uint32_t next_free; /* free list link (slot + 1; 0 = end) */
  bool live;
  bool recorded;
  bool pending;       /* recorded while its stream was held */
  expseg_stream stream;
  uint64_t hold_gen;
} evslot_t;

struct expseg_smodel_s {
  pthread_mutex_t mu;
  const char *name;
  held_t *held;
  size_t nheld, capheld;
  evslot_t *ev;
  size_t nev, capev;
  uint32_t free_head; /* slot + 1; 0 = none */
};

expseg_smodel_t *_expseg_smodel_new(const char *backend_name) {
  expseg_smodel_t *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  pthread_mutex_init(&m->mu, NULL);
  m->name = backend_name;
  return m;
}

void _expseg_smodel_free(expseg_smodel_t *m) {
  if (!m) return;
  pthread_mutex_destroy(&m->mu);
  free(m->held);
  free(m->ev);
  free(m);
}

static held_t *find_held(expseg_smodel_t *m, expseg_stream s) {
  for (size_t i = 0; i < m->nheld; i++)
    if (m->held[i].stream == s) return &m->held[i];
  return NULL;
}

/* The live slot of ev, or NULL with the message set. Caller holds mu. */
static evslot_t *lookup(expseg_smodel_t *m, expseg_vmm_event ev, const char *call) {
  uint64_t idx = (ev & 0xffffffffu);
  uint32_t gen = (uint32_t)(ev >> 32);
  if (idx == 0 || idx > m->nev || !m->ev[idx - 1].live || m->ev[idx - 1].gen != gen) {
    _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                      "%s driver: %s(event=0x%llx): not a live event of this driver", m->name,
                      call, (unsigned long long)ev);
    return NULL;
  }
  return &m->ev[idx - 1];
}

static bool is_done(expseg_smodel_t *m, const evslot_t *e) {
  if (!e->pending) return true;
  held_t *h = find_held(m, e->stream);
  return !(h && h->held && h->gen == e->hold_gen);
}

expseg_status _expseg_smodel_event_create(expseg_smodel_t *m, expseg_vmm_event *ev) {
  pthread_mutex_lock(&m->mu);
  uint32_t idx;
  if (m->free_head) {
    idx = m->free_head - 1;
    m->free_head = m->ev[idx].next_free;
  } else {
    if (m->nev == m->capev) {
      size_t cap = m->capev ? m->capev * 2 : 64;
      if (cap > 0xffffffffu) cap = 0xffffffffu;
      evslot_t *n = cap > m->capev ? realloc(m->ev, cap * sizeof *n) : NULL;
      if (!n) {
        pthread_mutex_unlock(&m->mu);
        return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                                 "%s driver: event_create: out of host memory for %zu events",
                                 m->name, m->nev + 1);
      }
      m->ev = n;
      m->capev = cap;
    }
    idx = (uint32_t)m->nev++;
    m->ev[idx].gen = 0;
  }
  evslot_t *e = &m->ev[idx];
  e->gen++;
  e->live = true;
  e->recorded = false;
  e->pending = false;
  e->next_free = 0;
  *ev = ((uint64_t)e->gen << 32) | (uint64_t)(idx + 1);
  pthread_mutex_unlock(&m->mu);
  return EXPSEG_OK;
}

expseg_status _expseg_smodel_event_destroy(expseg_smodel_t *m, expseg_vmm_event ev) {
  pthread_mutex_lock(&m->mu);
  evslot_t *e = lookup(m, ev, "event_destroy");
  if (!e) {
    pthread_mutex_unlock(&m->mu);
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  e->live = false;
  e->next_free = m->free_head;
  m->free_head = (uint32_t)(e - m->ev) + 1;
  pthread_mutex_unlock(&m->mu);
  return EXPSEG_OK;
}

expseg_status _expseg_smodel_event_record(expseg_smodel_t *m, expseg_vmm_event ev,
                                           expseg_stream s) {
  pthread_mutex_lock(&m->mu);
  evslot_t *e = lookup(m, ev, "event_record");
  if (!e) {
    pthread_mutex_unlock(&m->mu);
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  held_t *h = find_held(m, s);
  e->recorded = true;
  e->stream = s;
  e->pending = h && h->held;
  e->hold_gen = h ? h->gen : 0;
  pthread_mutex_unlock(&m->mu);
  return EXPSEG_OK;
}

static evslot_t *lookup_recorded(expseg_smodel_t *m, expseg_vmm_event ev, const char *call) {
  evslot_t *e = lookup(m, ev, call);
  if (e && !e->recorded) {
    _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                      "%s driver: %s(event=0x%llx): the event was never recorded", m->name,
                      call, (unsigned long long)ev);
    return NULL;
  }
  return e;
}

expseg_status _expseg_smodel_event_query(expseg_smodel_t *m, expseg_vmm_event ev,
                                          bool *done) {
  pthread_mutex_lock(&m->mu);
  evslot_t *e = lookup_recorded(m, ev, "event_query");
  if (e) *done = is_done(m, e);
  pthread_mutex_unlock(&m->mu);
  return e ? EXPSEG_OK : EXPSEG_ERR_INVALID_ARGUMENT;
}

expseg_status _expseg_smodel_event_synchronize(expseg_smodel_t *m, expseg_vmm_event ev) {
  pthread_mutex_lock(&m->mu);
  evslot_t *e = lookup_recorded(m, ev, "event_synchronize");
  expseg_status st = e ? EXPSEG_OK : EXPSEG_ERR_INVALID_ARGUMENT;
  if (e && !is_done(m, e))
    st = _expseg_error_set(EXPSEG_ERR_DRIVER,
                           "%s driver: event_synchronize(event=0x%llx) would block forever: "
                           "stream 0x%llx is held (release it with hold_stream(false))",
                           m->name, (unsigned long long)ev, (unsigned long long)e->stream);
  pthread_mutex_unlock(&m->mu);
  return st;
}

expseg_status _expseg_smodel_stream_synchronize(expseg_smodel_t *m, expseg_stream s) {
  pthread_mutex_lock(&m->mu);
  held_t *h = find_held(m, s);
  bool held = h && h->held;
  pthread_mutex_unlock(&m->mu);
  if (held)
    return _expseg_error_set(EXPSEG_ERR_DRIVER,
                             "%s driver: stream_synchronize would block forever: stream 0x%llx "
                             "is held (release it with hold_stream(false))",
                             m->name, (unsigned long long)s);
  return EXPSEG_OK;
}

/* Every stream at once: blocked while any stream is held. */
expseg_status _expseg_smodel_device_synchronize(expseg_smodel_t *m) {
  pthread_mutex_lock(&m->mu);
  const held_t *held = NULL;
  for (size_t i = 0; i < m->nheld && !held; i++)
    if (m->held[i].held) held = &m->held[i];
  expseg_stream s = held ? held->stream : 0;
  pthread_mutex_unlock(&m->mu);
  if (held)
    return _expseg_error_set(EXPSEG_ERR_DRIVER,
                             "%s driver: device_synchronize would block forever: stream 0x%llx "
                             "is held (release it with hold_stream(false))",
                             m->name, (unsigned long long)s);
  return EXPSEG_OK;
}

void _expseg_smodel_hold(expseg_smodel_t *m, expseg_stream s, bool hold) {
  pthread_mutex_lock(&m->mu);
  held_t *h = find_held(m, s);
  if (!h && hold) {
    if (m->nheld == m->capheld) {
      size_t cap = m->capheld ? m->capheld * 2 : 8;
      held_t *n = realloc(m->held, cap * sizeof *n);
      if (!n) { /* a test hook: report and carry on unheld */
        pthread_mutex_unlock(&m->mu);
        _expseg_warn("%s driver: hold_stream: out of host memory; stream not held", m->name);
        return;
      }
      m->held = n;
      m->capheld = cap;
    }
    h = &m->held[m->nheld++];
    h->stream = s;
    h->gen = 0;
    h->held = false;
  }
  if (h) {
    if (hold && !h->held) h->gen++;
    h->held = hold;
  }
  pthread_mutex_unlock(&m->mu);
}

/* ---- ops-shaped entry points: st begins with the expseg_smodel_t pointer ---- */

static expseg_smodel_t *model_of(void *st) { return *(expseg_smodel_t **)st; }

expseg_status _expseg_modelled_event_create(void *st, expseg_vmm_event *ev) {
  return _expseg_smodel_event_create(model_of(st), ev);
}
expseg_status _expseg_modelled_event_destroy(void *st, expseg_vmm_event ev) {
  return _expseg_smodel_event_destroy(model_of(st), ev);
}
expseg_status _expseg_modelled_event_record(void *st, expseg_vmm_event ev, expseg_stream s) {
  return _expseg_smodel_event_record(model_of(st), ev, s);
}
expseg_status _expseg_modelled_event_query(void *st, expseg_vmm_event ev, bool *done) {
  return _expseg_smodel_event_query(model_of(st), ev, done);
}
expseg_status _expseg_modelled_event_synchronize(void *st, expseg_vmm_event ev) {
  return _expseg_smodel_event_synchronize(model_of(st), ev);
}
expseg_status _expseg_modelled_stream_synchronize(void *st, expseg_stream s) {
  return _expseg_smodel_stream_synchronize(model_of(st), s);
}
expseg_status _expseg_modelled_device_synchronize(void *st) {
  return _expseg_smodel_device_synchronize(model_of(st));
}
void _expseg_modelled_hold_stream(void *st, expseg_stream s, bool hold) {
  _expseg_smodel_hold(model_of(st), s, hold);
}
uint64_t _expseg_modelled_now_ns(void *st) {
  (void)st;
  return _expseg_clock_ns();
}
