/* SPDX-License-Identifier: Apache-2.0 */
/* history.c: the allocation history behind expseg_record_history, in PyTorch's TraceEntry
 * terms (../shared/reference/pytorch-allocator.md §6).
 *
 * Each allocator that records owns a ring of the newest `max` events (grown by doubling up
 * to `max`, so a large bound costs nothing until used). An event holds its action, address,
 * size (the caller's requested size for alloc/free, as PyTorch), stream, time (the CPU's
 * time-stamp counter where there is one, turned into µs since the epoch when written) and a
 * stack: up to HIST_C_MAX return addresses from backtrace() (kept raw,
 * symbolized only when a snapshot is written, with dladdr) when EXPSEG_HISTORY_C_STACKS is
 * set, and the innermost HIST_HOST_MAX frames the calling thread pushed with
 * expseg_history_push_frames. Pushed frames are interned once, process-wide, in a table
 * guarded by its own mutex (the strings are copied; the table lives as long as the
 * process), so a thread's stack is an array of ids (as deep as pushed, freed when the
 * thread exits) and an event copies ids only.
 * Hooks run with the allocator's lock held; recording off costs the hook's one branch. */
#include "error.h"
#include "history.h"
#include "internal.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const action_names[HIST_ACTION_COUNT] = {
    "alloc",       "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap",  "oom",            "snapshot",      "annotate",
    "sleep",       "wake"};

const char *_expseg_hist_action_name(int action) {
  return action >= 0 && action < HIST_ACTION_COUNT ? action_names[action] : "unknown";
}

/* ---- PyTorch's skip_actions: the one table of names and flags ---- */

static const struct {
  const char *name;
  unsigned flag;
} skip_actions[] = {{"alloc", EXPSEG_HISTORY_SKIP_ALLOC},
                    {"free_requested", EXPSEG_HISTORY_SKIP_FREE_REQUESTED},
                    {"free_completed", EXPSEG_HISTORY_SKIP_FREE_COMPLETED},
                    {"segment_alloc", EXPSEG_HISTORY_SKIP_SEGMENT_ALLOC},
                    {"segment_free", EXPSEG_HISTORY_SKIP_SEGMENT_FREE},
                    {"oom", EXPSEG_HISTORY_SKIP_OOM},
                    {"snapshot", EXPSEG_HISTORY_SKIP_SNAPSHOT}};
#define N_SKIP (sizeof skip_actions / sizeof skip_actions[0])
/* every name, comma separated: filled once from the table */
static char skip_names[128];
static pthread_once_t skip_names_once = PTHREAD_ONCE_INIT;

static void skip_names_fill(void) {
  size_t at = 0;
  for (size_t i = 0; i < N_SKIP; i++)
    at += (size_t)snprintf(skip_names + at, sizeof skip_names - at, "%s%s", i ? ", " : "",
                           skip_actions[i].name);
}

const char *expseg_history_skip_action_names(void) {
  pthread_once(&skip_names_once, skip_names_fill);
  return skip_names;
}

static unsigned skip_all(void) {
  unsigned f = 0;
  for (size_t i = 0; i < N_SKIP; i++) f |= skip_actions[i].flag;
  return f;
}

expseg_status expseg_history_skip_action(const char *name, unsigned *flag) {
  if (flag == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_history_skip_action: flag is NULL");
  *flag = 0;
  for (size_t i = 0; name != NULL && i < N_SKIP; i++)
    if (strcmp(name, skip_actions[i].name) == 0) {
      *flag = skip_actions[i].flag;
      return EXPSEG_OK;
    }
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "skip_actions holds '%s'; accepted: %s", name ? name : "(null)",
                           expseg_history_skip_action_names());
}

/* ---- the process-wide table of pushed frames ---- */

typedef struct frame_rec_s {
  char *filename, *name;
  int line;
  uint64_t hash;
} frame_rec_t;

static pthread_mutex_t frames_lock = PTHREAD_MUTEX_INITIALIZER;
static frame_rec_t *frames;          /* id - 1 -> frame */
static size_t n_frames, cap_frames;
static uint32_t *frame_slots;        /* open addressing: id or 0 */
static size_t cap_slots;             /* power of two */

static uint64_t fnv(uint64_t h, const char *s) {
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return (h ^ 0xff) * 0x100000001b3ull;
}

static bool slots_grow(void) {
  size_t cap = cap_slots ? cap_slots * 2 : 1024;
  uint32_t *s = calloc(cap, sizeof *s);
  if (s == NULL) return false;
  for (size_t i = 0; i < n_frames; i++) {
    size_t j = frames[i].hash & (cap - 1);
    while (s[j]) j = (j + 1) & (cap - 1);
    s[j] = (uint32_t)(i + 1);
  }
  free(frame_slots);
  frame_slots = s;
  cap_slots = cap;
  return true;
}

/* frames_lock held. 0 when out of host memory. */
static uint32_t frame_intern(const char *filename, const char *name, int line) {
  uint64_t h = fnv(fnv(0xcbf29ce484222325ull ^ (uint64_t)(uint32_t)line, filename), name);
  if ((n_frames + 1) * 2 > cap_slots && !slots_grow()) return 0;
  size_t j = h & (cap_slots - 1);
  for (; frame_slots[j]; j = (j + 1) & (cap_slots - 1)) {
    const frame_rec_t *f = &frames[frame_slots[j] - 1];
    if (f->hash == h && f->line == line && !strcmp(f->filename, filename) &&
        !strcmp(f->name, name))
      return frame_slots[j];
  }
  if (n_frames == cap_frames) {
    size_t cap = cap_frames ? cap_frames * 2 : 256;
    frame_rec_t *p = realloc(frames, cap * sizeof *p);
    if (p == NULL) return 0;
    frames = p;
    cap_frames = cap;
  }
  char *fn = strdup(filename), *nm = strdup(name);
  if (fn == NULL || nm == NULL || n_frames >= UINT32_MAX - 1) {
    free(fn);
    free(nm);
    return 0;
  }
  frames[n_frames++] = (frame_rec_t){fn, nm, line, h};
  frame_slots[j] = (uint32_t)n_frames;
  return (uint32_t)n_frames;
}

/* ---- the calling thread's pushed frames: a stack of ids, innermost at depth - 1 ---- */

/* Grown by doubling (never shrunk while the thread lives; freed when it exits), so a pop
 * back from any depth finds the frames pushed below it. */
static _Thread_local uint32_t *tl_ids;
static _Thread_local size_t tl_depth, tl_cap;
static pthread_key_t tl_key; /* its destructor frees a finished thread's stack */
static pthread_once_t tl_key_once = PTHREAD_ONCE_INIT;
static bool tl_key_ok;

static void tl_free(void *p) { /* the exiting thread's: a later push starts afresh */
  free(p);
  tl_ids = NULL;
  tl_cap = tl_depth = 0;
}

static void tl_key_make(void) { tl_key_ok = pthread_key_create(&tl_key, tl_free) == 0; }

/* Room for `more` ids above the current depth; false when out of host memory. */
static bool tl_reserve(size_t more) {
  if (tl_depth + more <= tl_cap) return true;
  pthread_once(&tl_key_once, tl_key_make);
  size_t cap = tl_cap ? tl_cap : 64;
  while (cap < tl_depth + more) cap *= 2;
  uint32_t *p = tl_key_ok ? malloc(cap * sizeof *p) : NULL;
  if (p == NULL) return false;
  if (pthread_setspecific(tl_key, p) != 0) { /* the key keeps the old stack: still valid */
    free(p);
    return false;
  }
  if (tl_depth > 0) memcpy(p, tl_ids, tl_depth * sizeof *p);
  free(tl_ids);
  tl_ids = p;
  tl_cap = cap;
  return true;
}

expseg_status expseg_history_push_frames(const expseg_frame *f, size_t n) {
  if (n > 0 && f == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_history_push_frames: frames is NULL with n = %zu", n);
  for (size_t i = 0; i < n; i++)
    if (f[i].filename == NULL || f[i].name == NULL)
      return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                               "expseg_history_push_frames: frame %zu has a NULL %s; give "
                               "\"\" for an unknown file or function",
                               i, f[i].filename == NULL ? "filename" : "name");
  uint32_t ids[64];
  for (size_t done = 0; done < n;) {
    size_t k = n - done < 64 ? n - done : 64;
    size_t got = 0;
    if (tl_reserve(k)) {
      pthread_mutex_lock(&frames_lock);
      for (; got < k; got++) {
        ids[got] = frame_intern(f[done + got].filename, f[done + got].name, f[done + got].line);
        if (ids[got] == 0) break;
      }
      pthread_mutex_unlock(&frames_lock);
    }
    for (size_t i = 0; i < got; i++) tl_ids[tl_depth++] = ids[i];
    if (got < k)
      return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                               "expseg_history_push_frames: out of host memory after %zu of "
                               "%zu frames (those stay pushed)",
                               done + got, n);
    done += k;
  }
  return EXPSEG_OK;
}

void expseg_history_pop_frames(size_t n) { tl_depth = n < tl_depth ? tl_depth - n : 0; }

/* ---- recording ---- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t ticks_now(void) { return __rdtsc(); }
#else
static inline uint64_t ticks_now(void) { return now_ns(); }
#endif

uint64_t _expseg_hist_ticks(void) { return ticks_now(); }

double _expseg_hist_scale(const history_t *h) {
#if defined(__x86_64__) || defined(__i386__)
  uint64_t t1 = ticks_now(), n1 = now_ns();
  return t1 > h->ticks0 && n1 > h->ns0 ? (double)(n1 - h->ns0) / (double)(t1 - h->ticks0) : 0.0;
#else
  (void)h;
  return 1.0; /* ticks are CLOCK_REALTIME nanoseconds */
#endif
}

uint64_t _expseg_hist_time_us(const history_t *h, double scale, uint64_t ticks) {
  double ns = (double)h->ns0 + ((double)ticks - (double)h->ticks0) * scale;
  return ns > 0 ? (uint64_t)(ns / 1000.0) : 0;
}

hist_event_t *_expseg_hist_push(history_t *h, int action, uint64_t addr, uint64_t size,
                                expseg_stream stream) {
  hist_event_t *e;
  if (h->flags & (1u << (8 + action))) return NULL; /* skip_actions */
  if (h->count < h->max && h->count == h->cap) { /* grow (head is 0 until the ring is full) */
    size_t cap = h->cap * 2 < h->max ? h->cap * 2 : h->max;
    hist_event_t *p = realloc(h->ring, cap * sizeof *p);
    if (p != NULL) {
      h->ring = p;
      h->cap = cap;
    } else {
      h->max = h->cap; /* keep the newest of what fits */
    }
  }
  if (h->count < h->max) {
    e = &h->ring[h->count++];
  } else {
    e = &h->ring[h->head];
    h->head = h->head + 1 == h->max ? 0 : h->head + 1;
  }
  h->total++;
  e->ticks = ticks_now();
  e->addr = addr;
  e->size = size;
  e->stream = stream;
  e->pool = 0;
  e->action = (uint8_t)action;
  e->note = 0;
  e->compile = 0;
  e->n_c = 0;
  const hist_event_t *prev = h->count > 1 ? _expseg_hist_at(h, h->count - 2) : NULL;
  /* never before the event kept before it (another CPU's counter may read a little behind) */
  if (prev != NULL && e->ticks < prev->ticks) e->ticks = prev->ticks;
  if ((h->flags & EXPSEG_HISTORY_C_STACKS) && action == HIST_FREE_COMPLETED && prev != NULL &&
      prev->action == HIST_FREE_REQUESTED && prev->addr == addr) {
    e->n_c = prev->n_c; /* completed within the same free: the same C stack */
    memcpy(e->c, prev->c, prev->n_c * sizeof(void *));
  } else if (h->flags & EXPSEG_HISTORY_C_STACKS) {
    void *raw[HIST_C_MAX + 1];
    int n = backtrace(raw, HIST_C_MAX + 1); /* frame 0 is this function */
    if (n > 1) {
      e->n_c = (uint8_t)(n - 1);
      memcpy(e->c, raw + 1, (size_t)(n - 1) * sizeof(void *));
    }
  }
  size_t d = tl_depth < HIST_HOST_MAX ? tl_depth : HIST_HOST_MAX;
  for (size_t i = 0; i < d; i++) e->host[i] = tl_ids[tl_depth - 1 - i];
  e->n_host = (uint8_t)d;
  return e;
}

hist_event_t *_expseg_hist_add(expseg_allocator *a, int action, uint64_t addr, uint64_t size,
                               expseg_stream stream) {
  /* a stream key (internal.h): its stream and its pool */
  hist_event_t *e = _expseg_hist_push(a->hist, action, addr, size, skey_stream(stream));
  if (e != NULL) {
    e->pool = _expseg_ppool_id(a, skey_tag(stream));
    e->note = a->user_meta;
    e->compile = a->n_compile_ctx ? a->compile_ctx[a->n_compile_ctx - 1] : 0;
  }
  return e;
}

uint32_t _expseg_hist_note(const char *text) { /* interned as a frame with no file */
  pthread_mutex_lock(&frames_lock);
  uint32_t id = frame_intern("", text, 0);
  pthread_mutex_unlock(&frames_lock);
  return id;
}

const char *_expseg_hist_note_text(uint32_t id) {
  pthread_mutex_lock(&frames_lock);
  const char *t = id ? frames[id - 1].name : ""; /* never freed or moved */
  pthread_mutex_unlock(&frames_lock);
  return t;
}

const hist_event_t *_expseg_hist_at(const history_t *h, size_t i) {
  size_t j = h->head + i;
  if (j >= h->max) j -= h->max;
  return &h->ring[j];
}

void _expseg_hist_frame(const hist_event_t *e, size_t k, const char **filename,
                        const char **name, int *line, char *buf, size_t len) {
  if (k < e->n_c) {
    Dl_info info;
    memset(&info, 0, sizeof info);
    uintptr_t pc = (uintptr_t)e->c[k];
    if (dladdr(e->c[k], &info) != 0 && info.dli_sname != NULL)
      snprintf(buf, len, "%s+%#lx", info.dli_sname,
               (unsigned long)(pc - (uintptr_t)info.dli_saddr));
    else if (info.dli_fname != NULL)
      snprintf(buf, len, "%#lx", (unsigned long)(pc - (uintptr_t)info.dli_fbase));
    else
      snprintf(buf, len, "%#lx", (unsigned long)pc);
    *filename = info.dli_fname != NULL ? info.dli_fname : "??";
    *name = buf;
    *line = 0;
    return;
  }
  uint32_t id = e->host[k - e->n_c];
  pthread_mutex_lock(&frames_lock);
  const frame_rec_t *f = &frames[id - 1];
  *filename = f->filename; /* never freed or moved: the strings outlive the table's growth */
  *name = f->name;
  *line = f->line;
  pthread_mutex_unlock(&frames_lock);
}

/* ---- the public switch ---- */

expseg_status _expseg_hist_check(const char *fn, bool enabled, size_t max_entries,
                                  unsigned flags) {
  if (enabled && max_entries == 0)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s: max_entries is 0; at least 1 event must be kept (SIZE_MAX = "
                             "no bound)",
                             fn);
  const unsigned skips = skip_all();
  if (flags & ~(EXPSEG_HISTORY_C_STACKS | EXPSEG_HISTORY_CLEAR | skips))
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s: flags %#x hold unknown flags %#x; "
                             "accepted: EXPSEG_HISTORY_C_STACKS (1), EXPSEG_HISTORY_CLEAR (2) "
                             "and the EXPSEG_HISTORY_SKIP_* bits of %s (%#x)",
                             fn, flags,
                             flags & ~(EXPSEG_HISTORY_C_STACKS | EXPSEG_HISTORY_CLEAR | skips),
                             expseg_history_skip_action_names(), skips);
  return EXPSEG_OK;
}

history_t *_expseg_hist_new(size_t max_entries, unsigned flags) {
  size_t cap = max_entries < 1024 ? max_entries : 1024;
  history_t *h = calloc(1, sizeof *h);
  if (h != NULL) h->ring = malloc(cap * sizeof *h->ring);
  if (h == NULL || h->ring == NULL) {
    free(h);
    return NULL;
  }
  h->cap = cap;
  h->max = max_entries;
  h->flags = flags & ~EXPSEG_HISTORY_CLEAR;
  h->ticks0 = ticks_now();
  h->ns0 = now_ns();
  if (flags & EXPSEG_HISTORY_C_STACKS) { /* the first backtrace() loads the unwinder */
    void *warm[4];
    (void)backtrace(warm, 4);
  }
  return h;
}

void _expseg_hist_keep(history_t *h, const history_t *old, unsigned flags) {
  if (old == NULL || h == NULL || (flags & EXPSEG_HISTORY_CLEAR)) return;
  /* re-enabled: keep the newest events that fit */
  size_t keep = old->count < h->max ? old->count : h->max;
  hist_event_t *ring = keep > h->cap ? malloc(keep * sizeof *ring) : h->ring;
  if (ring == NULL) return;
  for (size_t i = 0; i < keep; i++) ring[i] = *_expseg_hist_at(old, old->count - keep + i);
  if (ring != h->ring) {
    free(h->ring);
    h->ring = ring;
    h->cap = keep;
  }
  h->count = keep;
  h->total = old->total;
  h->ticks0 = old->ticks0; /* the kept events' ticks count from the same origin */
  h->ns0 = old->ns0;
}

void _expseg_hist_free(history_t *h) {
  _expseg_hist_ann_free(h);
  if (h != NULL) free(h->ring);
  free(h);
}

expseg_status expseg_record_history_ex(expseg_allocator *a, bool enabled, size_t max_entries,
                                       unsigned flags) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_record_history: the allocator is NULL");
  expseg_status st = _expseg_hist_check("expseg_record_history", enabled, max_entries, flags);
  if (st != EXPSEG_OK) return st;
  history_t *h = NULL;
  if (enabled && (h = _expseg_hist_new(max_entries, flags)) == NULL)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_record_history: out of host memory");
  api_lock(a);
  history_t *old = a->hist;
  _expseg_hist_keep(h, old, flags);
  _expseg_hist_ann_move(h, old, flags);
  a->hist = h; /* disabling clears the history (as PyTorch) */
  api_unlock(a);
  _expseg_hist_free(old);
  return EXPSEG_OK;
}

expseg_status expseg_record_history(expseg_allocator *a, bool enabled, size_t max_entries) {
  return expseg_record_history_ex(a, enabled, max_entries, EXPSEG_HISTORY_C_STACKS);
}

void _expseg_hist_destroy(expseg_allocator *a) {
  _expseg_hist_free(a->hist);
  a->hist = NULL;
  free(a->compile_ctx);
  a->compile_ctx = NULL;
  a->n_compile_ctx = a->cap_compile_ctx = 0;
}

/* ---- compile context and user metadata (PyTorch's pushCompileContext, setUserMetadata) ---- */

expseg_status expseg_history_push_compile_context(expseg_allocator *a, const char *text) {
  if (a == NULL || text == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_history_push_compile_context: %s is NULL",
                             a == NULL ? "the allocator" : "text");
  uint32_t note = _expseg_hist_note(text); /* before the lock: the table has its own */
  if (note == 0)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "expseg_history_push_compile_context: out of host memory");
  api_lock(a);
  expseg_status st = EXPSEG_OK;
  if (a->n_compile_ctx == a->cap_compile_ctx) {
    size_t cap = a->cap_compile_ctx ? a->cap_compile_ctx * 2 : 8;
    uint32_t *p = realloc(a->compile_ctx, cap * sizeof *p);
    if (p == NULL) {
      st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "expseg_history_push_compile_context: out of host memory");
    } else {
      a->compile_ctx = p;
      a->cap_compile_ctx = cap;
    }
  }
  if (st == EXPSEG_OK) a->compile_ctx[a->n_compile_ctx++] = note;
  api_unlock(a);
  return st;
}

expseg_status expseg_history_pop_compile_context(expseg_allocator *a) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_history_pop_compile_context: the allocator is NULL");
  api_lock(a);
  if (a->n_compile_ctx > 0) a->n_compile_ctx--;
  api_unlock(a);
  return EXPSEG_OK;
}

expseg_status expseg_history_set_user_metadata(expseg_allocator *a, const char *text) {
  if (a == NULL || text == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_history_set_user_metadata: %s is NULL",
                             a == NULL ? "the allocator" : "text");
  uint32_t note = 0;
  if (*text != '\0' && (note = _expseg_hist_note(text)) == 0)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "expseg_history_set_user_metadata: out of host memory");
  api_lock(a);
  a->user_meta = note;
  api_unlock(a);
  return EXPSEG_OK;
}

size_t expseg_history_user_metadata(expseg_allocator *a, char *buf, size_t len) {
  if (buf != NULL && len > 0) buf[0] = '\0';
  if (a == NULL) return 1;
  api_lock(a);
  uint32_t note = a->user_meta;
  api_unlock(a);
  const char *t = _expseg_hist_note_text(note);
  if (buf != NULL && len > 0) snprintf(buf, len, "%s", t);
  return strlen(t) + 1;
}

/* ---- annotations and the traceback of one allocation ---- */

expseg_status expseg_history_annotate(expseg_allocator *a, const void *ptr, const char *text) {
  if (a == NULL || text == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_history_annotate: %s is NULL",
                             a == NULL ? "the allocator" : "text");
  uint32_t note = _expseg_hist_note(text); /* before the lock: the table has its own */
  if (note == 0)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "expseg_history_annotate: out of host memory");
  api_lock(a);
  expseg_status st = EXPSEG_OK;
  const block_t *b = ptr ? _expseg_ptrmap_get(&a->live, (uintptr_t)ptr) : NULL;
  if (ptr != NULL && b == NULL) {
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_history_annotate(%p): not a live allocation of this "
                           "allocator; pass a pointer expseg_malloc returned and not yet freed, "
                           "or NULL for a mark in time",
                           ptr);
  } else if (a->hist != NULL) {
    hist_event_t *e = _expseg_hist_add(a, HIST_ANNOTATE, b ? b->ptr : 0, b ? b->requested : 0,
                                       b ? block_alloc_key(b) : 0);
    if (e != NULL) e->note = note;
  }
  api_unlock(a);
  return st;
}

expseg_status expseg_allocation_traceback(expseg_allocator *a, const void *ptr, char *buf,
                                          size_t len, size_t *needed) {
  if (buf != NULL && len > 0) buf[0] = '\0';
  if (needed != NULL) *needed = 1;
  if (a == NULL || (buf == NULL && len > 0))
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_allocation_traceback: %s is NULL",
                             a == NULL ? "the allocator" : "buf (with len > 0)");
  api_lock(a);
  expseg_status st = EXPSEG_OK;
  const block_t *b = _expseg_ptrmap_get(&a->live, (uintptr_t)ptr);
  const history_t *h = a->hist;
  const hist_event_t *e = NULL;
  /* the newest alloc event at its address, unless a free of that address (either of the
   * two, as either may be skipped) or an alloc of another size comes first: those belong
   * to an older allocation, whose frames are not this one's */
  for (size_t i = h && b ? h->count : 0; i-- > 0;) {
    const hist_event_t *c = _expseg_hist_at(h, i);
    if (c->addr != b->ptr) continue;
    if (c->action == HIST_ALLOC) {
      if (c->size == b->requested) e = c;
      break;
    }
    if (c->action == HIST_FREE_COMPLETED || c->action == HIST_FREE_REQUESTED) break;
  }
  if (b == NULL || e == NULL) {
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_allocation_traceback(%p): %s", ptr,
                           b == NULL ? "not a live allocation of this allocator"
                           : h == NULL ? "the history is off: record it "
                                         "(expseg_record_history) before the allocation is made"
                           : (h->flags & EXPSEG_HISTORY_SKIP_ALLOC)
                               ? "the history no longer holds its alloc event: alloc events "
                                 "are not recorded (EXPSEG_HISTORY_SKIP_ALLOC is set); record "
                                 "without it to get tracebacks"
                               : "the history no longer holds its alloc event (a "
                                 "larger max_entries keeps more)");
  } else {
    size_t n = 0;
    for (size_t k = 0; k < (size_t)e->n_c + e->n_host; k++) {
      const char *filename, *name;
      int line;
      char sym[256];
      _expseg_hist_frame(e, k, &filename, &name, &line, sym, sizeof sym);
      int w = snprintf(buf && n < len ? buf + n : NULL, buf && n < len ? len - n : 0,
                       "%s:%d:%s\n", filename, line, name);
      if (w > 0) n += (size_t)w;
    }
    if (needed != NULL) *needed = n + 1;
  }
  api_unlock(a);
  return st;
}
