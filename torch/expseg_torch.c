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
 * includes a CUDA header: a cudaStream_t is a pointer whose value is the expseg_stream. */
#include "expseg_torch.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
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

void *expseg_torch_alloc(size_t size, int device, void *stream) {
  expseg_allocator *a = get(device, "expseg_torch_alloc");
  if (!a) return NULL;
  void *p = NULL;
  if (expseg_malloc(a, size, stream_of(stream), &p) != EXPSEG_OK) {
    fail(device, "expseg_torch_alloc(%zu bytes, device %d): %s", size, device,
         expseg_last_error());
    return NULL;
  }
  return p;
}

void expseg_torch_free(void *ptr, size_t size, int device, void *stream) {
  (void)stream;
  if (ptr == NULL) return;
  expseg_allocator *a = existing(device);
  if (!a) {
    fail(device, "expseg_torch_free(%p, %zu bytes, device %d): no expseg allocator for that "
                 "device, so the pointer is not expseg's; ignored", ptr, size, device);
    return;
  }
  if (expseg_free(a, ptr) != EXPSEG_OK)
    fail(device, "expseg_torch_free(%p, %zu bytes, device %d): %s; ignored", ptr, size, device,
         expseg_last_error());
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

void expseg_torch_record_stream(void *ptr, void *stream) {
  if (ptr == NULL) return;
  for (int d = 0; d < MAXDEV; d++) {
    expseg_allocator *a = existing(d);
    if (a && expseg_record_stream(a, ptr, stream_of(stream)) == EXPSEG_OK) return;
  }
  fail(-1, "expseg_torch_record_stream(%p): not a live pointer of any device's allocator; "
           "ignored", ptr);
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

int expseg_torch_empty_cache(int device) {
  if (device == -1) {
    int worst = EXPSEG_OK;
    for (int d = 0; d < MAXDEV; d++) {
      expseg_allocator *a = existing(d);
      int st = a ? check(d, "expseg_torch_empty_cache", expseg_empty_cache(a)) : EXPSEG_OK;
      if (st != EXPSEG_OK) worst = st;
    }
    return worst;
  }
  expseg_allocator *a = get(device, "expseg_torch_empty_cache");
  if (!a) return get_status;
  return check(device, "expseg_torch_empty_cache", expseg_empty_cache(a));
}

int expseg_torch_snapshot_dump(int device, const char *path) {
  expseg_allocator *a = get(device, "expseg_torch_snapshot_dump");
  if (!a) return get_status;
  return check(device, "expseg_torch_snapshot_dump", expseg_snapshot_dump(a, path));
}
