/* SPDX-License-Identifier: Apache-2.0 */
/* expseg_torch.c: libexpseg_torch.so, expseg behind PyTorch's CUDAPluggableAllocator.
 *
 * A fixed table of one allocator per device ordinal. The first call naming a device
 * creates its allocator under a mutex (double-checked with an acquire load, so the hot
 * path is one atomic load); a failed creation is retried at the next call. Allocators are
 * never destroyed: PyTorch frees tensors until the process ends, in any order.
 *
 * Failures keep their message per device (the library's own message is per thread, and
 * PyTorch allocates from many threads), and are printed to stderr: PyTorch does not check
 * what alloc returns on every path, so stderr is where a user sees why. Each device prints
 * at most PRINT_LIMIT messages, then one line saying where the rest are. Nothing here
 * includes a CUDA header: a cudaStream_t is a pointer whose value is the expseg_stream.
 *
 * Safe mode (expseg_torch_set_safe_free): for callers that cannot tell expseg about every
 * stream a block is used on (PyTorch's Python route: record_stream from C++ callers never
 * reaches a CUDAPluggableAllocator made from Python), frees are kept in a per-device list
 * and completed in batches after expseg_synchronize (every stream of the device idle), so no
 * freed block is reused while work queued before its free may still touch it. A batch
 * completes when the list reaches the batch size, when a malloc would otherwise grow the
 * cache (its free bytes are fewer than the request) or fail, and at empty_cache. A failed
 * synchronization completes nothing: the frees stay deferred (never reused unsafely).
 *
 * History settings given with device -1 are kept and applied to allocators created later
 * (PyTorch's _record_memory_history is process-wide). */
#include "expseg_torch.h"
#include "expseg_torch_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXDEV EXPSEG_TORCH_MAX_DEVICES
#define PRINT_LIMIT 8
#define MSG_LEN 1024

static _Atomic(expseg_allocator *) allocs[MAXDEV];
static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int device_limit = MAXDEV; /* expseg_torch_init lowers it */

static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static char errs[MAXDEV + 1][MSG_LEN]; /* [MAXDEV]: failures that name no valid device */
static unsigned printed[MAXDEV + 1];

static _Thread_local int get_status; /* why the last get() of this thread returned NULL */
static _Thread_local int alloc_status; /* the last expseg_torch_alloc of this thread */

/* Safe mode: the batch size (0 = off) and each device's deferred frees, in free order. */
typedef struct {
  void *ptr;
  size_t size;
} deferred_t;
typedef struct {
  deferred_t *items;
  size_t n, cap, bytes;
} defer_list_t;
static atomic_size_t safe_batch;
static pthread_mutex_t defer_mu = PTHREAD_MUTEX_INITIALIZER;  /* the lists */
static pthread_mutex_t flush_mu = PTHREAD_MUTEX_INITIALIZER;  /* one batch completes at once */
static defer_list_t defers[MAXDEV];
static atomic_size_t deferred_total; /* all devices: the free path's fast check */

/* History for allocators created later (set with device -1). */
static pthread_mutex_t history_mu = PTHREAD_MUTEX_INITIALIZER;
static bool history_on;
static size_t history_max;
static unsigned history_flags;

static int slot(int device) { return device >= 0 && device < MAXDEV ? device : MAXDEV; }

/* Keeps the message for the device and prints it (up to PRINT_LIMIT per device). */
static void fail(int device, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(int device, const char *fmt, ...) {
  char m[MSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  int s = slot(device);
  pthread_mutex_lock(&err_mu);
  memcpy(errs[s], m, sizeof m);
  unsigned n = ++printed[s];
  pthread_mutex_unlock(&err_mu);
  if (n <= PRINT_LIMIT) fprintf(stderr, "expseg_torch: %s\n", m);
  if (n == PRINT_LIMIT)
    fprintf(stderr, "expseg_torch: device %d: later failures are not printed; "
                    "expseg_torch_last_error(%d) has the latest\n", device, device);
}

void _expseg_torch_fail_msg(int device, const char *msg) { fail(device, "%s", msg); }

static bool valid_device(int device, const char *call) {
  int limit = atomic_load_explicit(&device_limit, memory_order_relaxed);
  if (device >= 0 && device < limit) return true;
  fail(device, "%s: device %d: expected 0 <= device < %d%s", call, device, limit,
       limit < MAXDEV ? " (the device count given to expseg_torch_init)" : "");
  return false;
}

/* The device's allocator, created on first use; NULL (message kept) when it cannot be. */
static expseg_allocator *get(int device, const char *call) {
  get_status = EXPSEG_ERR_INVALID_ARGUMENT;
  if (!valid_device(device, call)) return NULL;
  expseg_allocator *a = atomic_load_explicit(&allocs[device], memory_order_acquire);
  if (a) return a;
  pthread_mutex_lock(&create_mu);
  a = atomic_load_explicit(&allocs[device], memory_order_relaxed);
  if (!a) {
    expseg_status st = expseg_create(NULL, device, NULL, &a);
    get_status = st;
    pthread_mutex_lock(&history_mu);
    if (st == EXPSEG_OK && history_on) {
      st = expseg_record_history_ex(a, true, history_max, history_flags);
      if (st != EXPSEG_OK) {
        get_status = st;
        expseg_destroy(a);
        a = NULL;
      }
    }
    pthread_mutex_unlock(&history_mu);
    if (st == EXPSEG_OK)
      atomic_store_explicit(&allocs[device], a, memory_order_release);
    else
      fail(device, "%s: no allocator for device %d: %s", call, device, expseg_last_error());
  }
  pthread_mutex_unlock(&create_mu);
  return a;
}

/* The allocator if it exists already (never creates one). */
static expseg_allocator *existing(int device) {
  if (device < 0 || device >= MAXDEV) return NULL;
  return atomic_load_explicit(&allocs[device], memory_order_acquire);
}

static expseg_stream stream_of(void *stream) { return (expseg_stream)(uintptr_t)stream; }

/* Status of a call on the device's allocator, message kept on failure. */
static int check(int device, const char *call, expseg_status st) {
  if (st != EXPSEG_OK) fail(device, "%s(device %d): %s", call, device, expseg_last_error());
  return (int)st;
}

/* ---- safe mode: deferred frees ---- */

static size_t deferred_count(int device) {
  if (atomic_load_explicit(&deferred_total, memory_order_relaxed) == 0) return 0;
  pthread_mutex_lock(&defer_mu);
  size_t n = defers[device].n;
  pthread_mutex_unlock(&defer_mu);
  return n;
}

static void free_now(expseg_allocator *a, int device, void *ptr, size_t size) {
  if (expseg_free(a, ptr) != EXPSEG_OK)
    fail(device, "expseg_torch_free(%p, %zu bytes, device %d): %s; ignored", ptr, size, device,
         expseg_last_error());
}

/* Completes the frees deferred on the device so far: synchronizes the device, then frees
 * them. On a failed synchronization they stay deferred and the status is returned. */
static int flush(expseg_allocator *a, int device, const char *call) {
  pthread_mutex_lock(&flush_mu);
  pthread_mutex_lock(&defer_mu);
  size_t taken = defers[device].n; /* freed before the synchronization starts */
  pthread_mutex_unlock(&defer_mu);
  int st = EXPSEG_OK;
  if (taken) st = expseg_synchronize(a);
  if (st != EXPSEG_OK) {
    fail(device, "%s(device %d): the device-wide synchronization before completing %zu "
                 "deferred frees failed: %s; they stay deferred", call, device, taken,
         expseg_last_error());
  } else if (taken) {
    pthread_mutex_lock(&defer_mu);
    defer_list_t *d = &defers[device];
    for (size_t i = 0; i < taken; i++) {
      free_now(a, device, d->items[i].ptr, d->items[i].size);
      d->bytes -= d->items[i].size;
    }
    memmove(d->items, d->items + taken, (d->n - taken) * sizeof *d->items);
    d->n -= taken;
    atomic_fetch_sub_explicit(&deferred_total, taken, memory_order_relaxed);
    pthread_mutex_unlock(&defer_mu);
  }
  pthread_mutex_unlock(&flush_mu);
  return st;
}

/* Appends a free to the device's list; completes the batch when it is full. */
static void defer_free(expseg_allocator *a, int device, void *ptr, size_t size, size_t batch) {
  pthread_mutex_lock(&defer_mu);
  defer_list_t *d = &defers[device];
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : batch;
    deferred_t *n = realloc(d->items, cap * sizeof *n);
    if (!n) { /* no room to defer: complete this free safely now */
      pthread_mutex_unlock(&defer_mu);
      expseg_status st = expseg_synchronize(a);
      if (st == EXPSEG_OK)
        free_now(a, device, ptr, size);
      else
        fail(device, "expseg_torch_free(%p, %zu bytes, device %d): out of host memory for the "
                     "deferred list and the device-wide synchronization failed (%s): the "
                     "block stays in use", ptr, size, device, expseg_last_error());
      return;
    }
    d->items = n;
    d->cap = cap;
  }
  d->items[d->n++] = (deferred_t){ptr, size};
  d->bytes += size;
  atomic_fetch_add_explicit(&deferred_total, 1, memory_order_relaxed);
  bool full = d->n >= batch;
  pthread_mutex_unlock(&defer_mu);
  if (full) (void)flush(a, device, "expseg_torch_free");
}

/* Would a malloc of size grow the cache? Its free bytes (reserved - allocated) are fewer. */
static bool would_grow(const expseg_allocator *a, size_t size) {
  int64_t reserved = 0, allocated = 0;
  if (expseg_stat(a, "reserved_bytes.all.current", &reserved) != EXPSEG_OK ||
      expseg_stat(a, "allocated_bytes.all.current", &allocated) != EXPSEG_OK)
    return true;
  return reserved - allocated < (int64_t)size;
}

int expseg_torch_set_safe_free(int batch) {
  if (batch < 0 || batch > (1 << 24)) {
    fail(-1, "expseg_torch_set_safe_free(%d): expected 0 (off) or a batch size of 1 to %d "
             "frees", batch, 1 << 24);
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  size_t old = atomic_exchange(&safe_batch, (size_t)batch);
  if (batch == 0 && old != 0) { /* off: complete what is deferred */
    int worst = EXPSEG_OK;
    for (int d = 0; d < MAXDEV; d++) {
      expseg_allocator *a = existing(d);
      int st = a && deferred_count(d) ? flush(a, d, "expseg_torch_set_safe_free") : EXPSEG_OK;
      if (st != EXPSEG_OK) worst = st;
    }
    return worst;
  }
  return EXPSEG_OK;
}

int expseg_torch_deferred(int device, size_t *count, size_t *bytes) {
  if (device < 0 || device >= MAXDEV) {
    fail(device, "expseg_torch_deferred: device %d: expected 0 <= device < %d", device, MAXDEV);
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&defer_mu);
  if (count) *count = defers[device].n;
  if (bytes) *bytes = defers[device].bytes;
  pthread_mutex_unlock(&defer_mu);
  return EXPSEG_OK;
}

int expseg_torch_synchronize(int device) {
  expseg_allocator *a = get(device, "expseg_torch_synchronize");
  if (!a) return get_status;
  return check(device, "expseg_torch_synchronize", expseg_synchronize(a));
}

int expseg_torch_region(int device, const char *tag, int begin) {
  expseg_allocator *a = get(device, "expseg_torch_region");
  if (!a) return get_status;
  return check(device, "expseg_torch_region",
               begin ? expseg_region_begin(a, tag) : expseg_region_end(a, tag));
}

int expseg_torch_sleep(int device, const char *tag, int mode) {
  expseg_allocator *a = get(device, "expseg_torch_sleep");
  if (!a) return get_status;
  return check(device, "expseg_torch_sleep", expseg_sleep(a, tag, (expseg_sleep_mode)mode));
}

int expseg_torch_wake(int device, const char *tag) {
  expseg_allocator *a = get(device, "expseg_torch_wake");
  if (!a) return get_status;
  return check(device, "expseg_torch_wake", expseg_wake(a, tag));
}

/* ---- the two functions CUDAPluggableAllocator takes ---- */

void *expseg_torch_alloc(size_t size, int device, void *stream) {
  expseg_allocator *a = get(device, "expseg_torch_alloc");
  alloc_status = a ? EXPSEG_OK : get_status;
  if (!a) return NULL;
  void *p = NULL;
  bool pending = deferred_count(device) > 0;
  if (pending && would_grow(a, size)) (void)flush(a, device, "expseg_torch_alloc");
  expseg_status st = expseg_malloc(a, size, stream_of(stream), &p);
  if (st == EXPSEG_ERR_OUT_OF_MEMORY && deferred_count(device) > 0 &&
      flush(a, device, "expseg_torch_alloc") == EXPSEG_OK)
    st = expseg_malloc(a, size, stream_of(stream), &p);
  alloc_status = st;
  if (st != EXPSEG_OK) {
    fail(device, "expseg_torch_alloc(%zu bytes, device %d): %s", size, device,
         expseg_last_error());
    return NULL;
  }
  return p;
}

int expseg_torch_alloc_status(void) { return alloc_status; }

void expseg_torch_free(void *ptr, size_t size, int device, void *stream) {
  (void)stream;
  if (ptr == NULL) return;
  expseg_allocator *a = existing(device);
  if (!a) {
    fail(device, "expseg_torch_free(%p, %zu bytes, device %d): no expseg allocator for that "
                 "device, so the pointer is not expseg's; ignored", ptr, size, device);
    return;
  }
  size_t batch = atomic_load_explicit(&safe_batch, memory_order_relaxed);
  if (batch)
    defer_free(a, device, ptr, size, batch);
  else
    free_now(a, device, ptr, size);
}

void expseg_torch_init(int device_count) {
  if (device_count > 0 && device_count <= MAXDEV)
    atomic_store_explicit(&device_limit, device_count, memory_order_relaxed);
  else if (device_count > MAXDEV)
    fail(-1, "expseg_torch_init(%d): only devices 0..%d are served", device_count, MAXDEV - 1);
}

void expseg_torch_reset(void) { (void)expseg_torch_empty_cache(-1); }

void expseg_torch_memory_fraction(double fraction, int device) {
  expseg_allocator *a = get(device, "expseg_torch_memory_fraction");
  if (a) check(device, "expseg_torch_memory_fraction", expseg_set_memory_fraction(a, fraction));
}

int expseg_torch_set_memory_fraction(int device, double fraction) {
  expseg_allocator *a = get(device, "expseg_torch_set_memory_fraction");
  if (!a) return get_status;
  return check(device, "expseg_torch_set_memory_fraction",
               expseg_set_memory_fraction(a, fraction));
}

int expseg_torch_record_stream_status(void *ptr, void *stream) {
  if (ptr == NULL) return EXPSEG_OK;
  for (int d = 0; d < MAXDEV; d++) {
    expseg_allocator *a = existing(d);
    expseg_pool_id pool;
    if (a == NULL || expseg_pool_of(a, ptr, &pool) != EXPSEG_OK) continue; /* not its block */
    expseg_status st = expseg_record_stream(a, ptr, stream_of(stream));
    if (st != EXPSEG_OK) /* the owner refused (a stream value it does not accept): say why */
      fail(-1, "expseg_torch_record_stream(%p, device %d): %s; ignored", ptr, d,
           expseg_last_error());
    return (int)st;
  }
  fail(-1, "expseg_torch_record_stream(%p): not a live pointer of any device's allocator; "
           "ignored", ptr);
  return EXPSEG_ERR_INVALID_ARGUMENT;
}

void expseg_torch_record_stream(void *ptr, void *stream) {
  (void)expseg_torch_record_stream_status(ptr, stream);
}

int expseg_torch_record_history(int device, int enabled, size_t max_entries, unsigned flags) {
  if (enabled && max_entries == 0) {
    fail(device, "expseg_torch_record_history(device %d): max_entries 0: expected at least 1",
         device);
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  if (device != -1) {
    expseg_allocator *a = get(device, "expseg_torch_record_history");
    if (!a) return get_status;
    return check(device, "expseg_torch_record_history",
                 expseg_record_history_ex(a, enabled != 0, max_entries, flags));
  }
  pthread_mutex_lock(&history_mu); /* held: a device created meanwhile sees the new setting */
  history_on = enabled != 0;
  history_max = max_entries;
  history_flags = flags;
  int worst = EXPSEG_OK;
  for (int d = 0; d < MAXDEV; d++) {
    expseg_allocator *a = existing(d);
    int st = a ? check(d, "expseg_torch_record_history",
                       expseg_record_history_ex(a, enabled != 0, max_entries, flags))
               : EXPSEG_OK;
    if (st != EXPSEG_OK) worst = st;
  }
  pthread_mutex_unlock(&history_mu);
  return worst;
}

size_t expseg_torch_memory_summary(int device, char *buf, size_t len, int abbreviated) {
  expseg_allocator *a = get(device, "expseg_torch_memory_summary");
  if (buf && len) buf[0] = '\0';
  if (!a) return 0;
  return expseg_memory_summary(a, buf, len, abbreviated != 0);
}

size_t expseg_torch_config_string(int device, char *buf, size_t len) {
  expseg_allocator *a = get(device, "expseg_torch_config_string");
  if (buf && len) buf[0] = '\0';
  if (!a) return 0;
  return expseg_config_string(a, buf, len);
}

int expseg_torch_device_used(int device) { return existing(device) != NULL; }

int expseg_torch_device_count(void) {
  int n = 0;
  for (int d = 0; d < MAXDEV; d++)
    if (existing(d)) n = d + 1;
  return n;
}

expseg_allocator *expseg_torch_allocator(int device, int create) {
  return create ? get(device, "expseg_torch_allocator") : existing(device);
}

const char *expseg_torch_last_error(int device) {
  static _Thread_local char copy[MSG_LEN];
  pthread_mutex_lock(&err_mu);
  memcpy(copy, errs[slot(device)], sizeof copy);
  pthread_mutex_unlock(&err_mu);
  return copy;
}

const char *expseg_torch_driver_name(int device) {
  expseg_allocator *a = get(device, "expseg_torch_driver_name");
  return a ? expseg_driver_name(a) : "";
}

int expseg_torch_get_info(int device, expseg_info *info) {
  expseg_allocator *a = get(device, "expseg_torch_get_info");
  if (!a) return get_status;
  return check(device, "expseg_torch_get_info", expseg_get_info(a, info));
}

int expseg_torch_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes) {
  expseg_allocator *a = get(device, "expseg_torch_mem_get_info");
  if (!a) return get_status;
  return check(device, "expseg_torch_mem_get_info",
               expseg_mem_get_info(a, free_bytes, total_bytes));
}

int expseg_torch_stat(int device, const char *key, int64_t *value) {
  expseg_allocator *a = get(device, "expseg_torch_stat");
  if (!a) return get_status;
  return check(device, "expseg_torch_stat", expseg_stat(a, key, value));
}

int expseg_torch_stats_foreach(int device, void (*fn)(void *ctx, const char *key, int64_t value),
                               void *ctx) {
  expseg_allocator *a = get(device, "expseg_torch_stats_foreach");
  if (!a) return get_status;
  if (!fn) {
    fail(device, "expseg_torch_stats_foreach(device %d): fn is NULL", device);
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }
  expseg_stats_foreach(a, fn, ctx);
  return EXPSEG_OK;
}

typedef struct {
  char *buf;
  size_t len, used; /* used: the whole text's length, even past len */
} json_t;

static void json_put(json_t *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void json_put(json_t *j, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = j->used < j->len ? j->len - j->used : 0;
  int n = vsnprintf(room ? j->buf + j->used : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) j->used += (size_t)n;
}

static void json_stat(void *ctx, const char *key, int64_t value) {
  json_t *j = ctx;
  /* keys are plain ASCII names ([a-z0-9_.]): nothing to escape */
  json_put(j, "%s\"%s\": %" PRId64, j->used > 1 ? ", " : "", key, value);
}

size_t expseg_torch_stats_json(int device, char *buf, size_t len) {
  expseg_allocator *a = get(device, "expseg_torch_stats_json");
  if (buf && len) buf[0] = '\0';
  if (!a) return 0;
  json_t j = {buf, buf ? len : 0, 0};
  json_put(&j, "{");
  expseg_stats_foreach(a, json_stat, &j);
  json_put(&j, "}");
  return j.used;
}

int expseg_torch_region_info_json(int device, const char *tag, char *buf, size_t len,
                                   size_t *needed) {
  if (buf && len) buf[0] = '\0';
  if (needed) *needed = 0;
  expseg_allocator *a = get(device, "expseg_torch_region_info_json");
  if (!a) return get_status;
  expseg_region_info r;
  int st = check(device, "expseg_torch_region_info_json", expseg_region_get_info(a, tag, &r));
  if (st != EXPSEG_OK) return st;
  json_t j = {buf, buf ? len : 0, 0};
  json_put(&j, "{\"pool\": %" PRIu64 ", \"asleep\": %s", r.pool, r.asleep ? "true" : "false");
#define FIELD(f) json_put(&j, ", \"" #f "\": %" PRIu64, r.f)
  FIELD(live_bytes); FIELD(device_bytes); FIELD(asleep_bytes); FIELD(host_bytes);
  FIELD(host_kept_bytes); FIELD(deferred_frees); FIELD(sleeps); FIELD(wakes);
  FIELD(last_sleep_us); FIELD(last_wake_us); FIELD(last_sleep_at_us); FIELD(last_wake_at_us);
  FIELD(last_sleep_copy_us); FIELD(last_wake_copy_us);
#undef FIELD
  json_put(&j, "}");
  if (needed) *needed = j.used + 1;
  return EXPSEG_OK;
}

int expseg_torch_reset_peak_stats(int device) {
  expseg_allocator *a = get(device, "expseg_torch_reset_peak_stats");
  if (!a) return get_status;
  expseg_reset_peak_stats(a);
  return EXPSEG_OK;
}

int expseg_torch_reset_accumulated_stats(int device) {
  expseg_allocator *a = get(device, "expseg_torch_reset_accumulated_stats");
  if (!a) return get_status;
  expseg_reset_accumulated_stats(a);
  return EXPSEG_OK;
}

/* Completes the device's deferred frees (safe mode), then empties its cache. */
static int empty_one(expseg_allocator *a, int device) {
  int st = deferred_count(device) ? flush(a, device, "expseg_torch_empty_cache") : EXPSEG_OK;
  int st2 = check(device, "expseg_torch_empty_cache", expseg_empty_cache(a));
  return st != EXPSEG_OK ? st : st2;
}

int expseg_torch_empty_cache(int device) {
  if (device == -1) {
    int worst = EXPSEG_OK;
    for (int d = 0; d < MAXDEV; d++) {
      expseg_allocator *a = existing(d);
      int st = a ? empty_one(a, d) : EXPSEG_OK;
      if (st != EXPSEG_OK) worst = st;
    }
    return worst;
  }
  expseg_allocator *a = get(device, "expseg_torch_empty_cache");
  if (!a) return get_status;
  return empty_one(a, device);
}

int expseg_torch_snapshot_dump(int device, const char *path) {
  return expseg_torch_snapshot_dump_ex(device, path, 0);
}

/* With the pinned host pool (host_segments, host_traces) once the program has used it. */
int expseg_torch_snapshot_dump_ex(int device, const char *path, unsigned flags) {
  expseg_allocator *a = get(device, "expseg_torch_snapshot_dump");
  if (!a) return get_status;
  expseg_host_pool *h = _expseg_torch_host_existing();
  return check(device, "expseg_torch_snapshot_dump",
               h ? expseg_snapshot_dump_with_host(a, h, path, flags)
                 : expseg_snapshot_dump_ex(a, path, flags));
}

int expseg_torch_annotate(int device, void *ptr, const char *text) {
  expseg_allocator *a = get(device, "expseg_torch_annotate");
  if (!a) return get_status;
  return check(device, "expseg_torch_annotate", expseg_history_annotate(a, ptr, text));
}

int expseg_torch_record_annotation(int device, const char *const *keys,
                                   const char *const *values, size_t n) {
  pthread_mutex_lock(&history_mu);
  bool all = history_on;
  pthread_mutex_unlock(&history_mu);
  expseg_allocator *a = all ? get(device, "expseg_torch_record_annotation") : existing(device);
  if (!a) {
    if (all) return get_status;
    return valid_device(device, "expseg_torch_record_annotation") ? EXPSEG_OK
                                                                   : EXPSEG_ERR_INVALID_ARGUMENT;
  }
  return check(device, "expseg_torch_record_annotation",
               expseg_history_record_annotation(a, keys, values, n));
}

int expseg_torch_allocation_traceback(int device, void *ptr, char *buf, size_t len,
                                      size_t *needed) {
  expseg_allocator *a = get(device, "expseg_torch_allocation_traceback");
  if (!a) return get_status;
  return check(device, "expseg_torch_allocation_traceback",
               expseg_allocation_traceback(a, ptr, buf, len, needed));
}
