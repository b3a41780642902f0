/* SPDX-License-Identifier: Apache-2.0 */
/* ipc.c: sharing live allocations with other processes (docs/ipc.md).
 *
 * Export describes the physical chunks under an allocation: a classic segment's one chunk,
 * or the pages of an expandable segment that the allocation touches. Each chunk's
 * descriptor comes from the driver (export_fd: host, a dup of the arena memfd and the
 * chunk's offset in it; cuda, a POSIX fd of the allocation handle); regular files that are
 * the same file (host arenas) are sent once and named by index. The handle's bytes are a
 * fixed little-endian layout, every size explicit and every padding byte zero (PyTorch
 * issue #198305 padded its header inconsistently):
 *   header (64 bytes): magic "EXIP", version u16 = 1, header size u16 = 64, entry size
 *     u16 = 32, zero u16, chunk count u32, descriptor count u32, liveness descriptor index
 *     u32, extent u64 (bytes the importer reserves), offset u64 (where the allocation starts
 *     in the extent), size u64 (the allocation's requested size), flags u64 = 0, zero u64;
 *   one entry (32 bytes) per chunk, in address order, tiling the extent: descriptor index
 *     u32, zero u32, file offset u64, offset in the extent u64, size u64.
 * The importer checks all of it before any driver call, then reserves exactly the extent,
 * imports and maps each chunk, and sets access once for the whole range (its device, then
 * each enabled peer).
 *
 * Liveness without pidfd: export makes a socketpair; the exporter keeps one end, the other
 * is the handle's last descriptor. Every importer keeps a dup of it until expseg_ipc_close,
 * and the kernel closes it when the importer dies. When every copy is closed (the exporter
 * has freed its handle too), the exporter's end reads EOF: polled (poll(2), no wait) at
 * every malloc that misses the cache, empty_cache and expseg_ipc_poll while exports are
 * held. Until then the exported block stays allocated: an expseg_free of it is deferred (done at the poll that
 * sees the last importer go), so its memory is never reused, moved nor released under an
 * importer. An import whose handle's exporter end is already closed (the exporter destroyed
 * or dead) is refused as stale. An import's teardown records each step it completes, so a
 * driver refusal part-way through expseg_ipc_close (or through the undo of a failed import)
 * is taken up again by the next close, import or destroy instead of being leaked.
 * Everything here runs under the allocator's lock. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

enum { VERSION = 1, HDR = 64, ENT = 32 };
#define MAX_CHUNKS (1u << 20)

typedef struct {
  uintptr_t ptr;
  int sock;   /* the exporter's end */
  bool freed; /* expseg_free was asked: done when the last importer goes */
} export_t;

/* What an import holds, step by step, so that a teardown refused part-way by the driver is
 * taken up again where it stopped: by the next expseg_ipc_close of ptr, or, for an import
 * that failed (ptr 0, an orphan), by the next import or close, and by destroy. */
typedef struct {
  uintptr_t ptr, base;
  size_t extent;
  expseg_vmm_handle *h; /* 0 once released */
  size_t *sizes;
  size_t n;
  size_t mapped;  /* the first `mapped` chunks are mapped */
  bool reserved;  /* base .. base + extent is reserved */
  int live;       /* dup of the liveness socket */
} import_t;

struct ipc_state_s {
  export_t *ex;
  size_t n_ex, cap_ex;
  import_t *im;
  size_t n_im, cap_im;
};

static void put16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}
static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t getn(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = n; i-- > 0;) v = v << 8 | p[i];
  return v;
}

static bool grow(void **arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return true;
  size_t c = *cap ? *cap * 2 : 4;
  void *t = realloc(*arr, c * elem);
  if (!t) return false;
  *arr = t;
  *cap = c;
  return true;
}

static struct ipc_state_s *state(expseg_allocator *a) {
  if (!a->ipc) a->ipc = calloc(1, sizeof *a->ipc);
  return a->ipc;
}

static expseg_status no_memory(const char *fn) {
  return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "%s: out of host memory", fn);
}

/* ---- export ---- */

typedef struct {
  int *fds;
  struct stat *st;
  size_t n, cap;
} fdset_t;

/* Adds fd (taking it), or closes it when it names a regular file already in the set. */
static bool fdset_add(fdset_t *s, int fd, uint32_t *index) {
  struct stat sb;
  bool reg = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
  for (size_t i = 0; reg && i < s->n; i++)
    if (S_ISREG(s->st[i].st_mode) && s->st[i].st_dev == sb.st_dev && s->st[i].st_ino == sb.st_ino) {
      close(fd);
      *index = (uint32_t)i;
      return true;
    }
  if (s->n == s->cap) {
    size_t c = s->cap ? s->cap * 2 : 8;
    int *f = realloc(s->fds, c * sizeof *f);
    if (f) s->fds = f;
    struct stat *t = f ? realloc(s->st, c * sizeof *t) : NULL;
    if (!t) return false;
    s->st = t;
    s->cap = c;
  }
  if (!reg) memset(&sb, 0, sizeof sb);
  s->fds[s->n] = fd;
  s->st[s->n] = sb;
  *index = (uint32_t)s->n++;
  return true;
}

static void fdset_close(fdset_t *s) {
  for (size_t i = 0; i < s->n; i++) close(s->fds[i]);
  free(s->fds), free(s->st);
}

static bool is_held(const struct ipc_state_s *S, uintptr_t ptr, bool *freed) {
  bool any = false;
  for (size_t i = 0; S && i < S->n_ex; i++)
    if (S->ex[i].ptr == ptr) any = true, *freed = *freed || S->ex[i].freed;
  return any;
}

static expseg_status export_locked(expseg_allocator *a, uintptr_t ptr, expseg_ipc_handle *out) {
  block_t *b = _expseg_ptrmap_get(&a->live, ptr);
  bool freed = false;
  if (b == NULL || b->state != BLOCK_ALLOCATED || (is_held(a->ipc, ptr, &freed) && freed))
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_export(%p): not the start of a live allocation of this "
                             "allocator",
                             (void *)ptr);
  segment_t *s = b->seg;
  if (s->asleep) /* its region sleeps (or is going to sleep): no memory behind it */
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_export(%p): its region \"%s\" is asleep; accepted: an "
                             "allocation of an awake region (expseg_wake it first)",
                             (void *)ptr, _expseg_sleep_region_name(a, seg_tag(s)));
  /* the chunks under the block: pages [first, last) of whole chunks (pools/pages.c) */
  size_t first = 0, last = 0, n = 1, extent = s->va_size;
  uintptr_t start = s->base;
  if (s->expandable) {
    first = (b->ptr - s->base) / s->page;
    first -= s->pages[first].off;
    size_t lp = (b->ptr + b->size - 1 - s->base) / s->page;
    last = lp - s->pages[lp].off + s->pages[lp].n;
    n = 0;
    for (size_t i = first; i < last; i += s->pages[i].n) n++;
    extent = (last - first) * s->page;
    start = s->base + first * s->page;
  }
  if (n > MAX_CHUNKS)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "expseg_ipc_export(%p): %zu chunks; at most %u per handle",
                             (void *)ptr, n, MAX_CHUNKS);
  struct ipc_state_s *S = state(a);
  size_t size = HDR + n * ENT;
  unsigned char *d = calloc(1, size);
  if (!S || !d || !grow((void **)&S->ex, &S->cap_ex, S->n_ex, sizeof *S->ex)) {
    free(d);
    return no_memory("expseg_ipc_export");
  }
  fdset_t fs = {0};
  expseg_status st = EXPSEG_OK;
  for (size_t i = 0, at = first; i < n && st == EXPSEG_OK; i++) {
    expseg_vmm_handle h = s->expandable ? s->pages[at].h : s->handle;
    const size_t csize = s->expandable ? s->pages[at].n * s->page : s->va_size;
    const size_t coff = (at - first) * s->page;
    if (s->expandable) at += s->pages[at].n;
    int fd = -1;
    size_t off = 0;
    uint32_t idx = 0;
    st = _expseg_vmm_export_fd(a->drv, h, &fd, &off);
    if (st == EXPSEG_OK && !fdset_add(&fs, fd, &idx)) {
      close(fd);
      st = no_memory("expseg_ipc_export");
    }
    unsigned char *e = d + HDR + i * ENT;
    put32(e, idx);
    put64(e + 8, off);
    put64(e + 16, coff);
    put64(e + 24, csize);
  }
  int sv[2] = {-1, -1};
  uint32_t live_idx = 0;
  if (st == EXPSEG_OK && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    st = _expseg_error_set(EXPSEG_ERR_DRIVER, "expseg_ipc_export: socketpair failed: %s",
                           strerror(errno));
  if (st == EXPSEG_OK && !fdset_add(&fs, sv[1], &live_idx)) {
    close(sv[0]), close(sv[1]);
    st = no_memory("expseg_ipc_export");
  }
  if (st != EXPSEG_OK) {
    fdset_close(&fs);
    free(d);
    return st;
  }
  memcpy(d, "EXIP", 4);
  put16(d + 4, VERSION);
  put16(d + 6, HDR);
  put16(d + 8, ENT);
  put32(d + 12, (uint32_t)n);
  put32(d + 16, (uint32_t)fs.n);
  put32(d + 20, live_idx);
  put64(d + 24, extent);
  put64(d + 32, b->ptr - start);
  put64(d + 40, b->requested);
  S->ex[S->n_ex++] = (export_t){.ptr = ptr, .sock = sv[0]};
  free(fs.st);
  *out = (expseg_ipc_handle){.data = d, .size = size, .fds = fs.fds, .n_fds = fs.n};
  return EXPSEG_OK;
}

expseg_status expseg_ipc_export(expseg_allocator *a, void *ptr, expseg_ipc_handle *out) {
  if (!a || !out)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_export: the allocator or the out-handle is NULL");
  memset(out, 0, sizeof *out);
  api_lock(a);
  expseg_status st = export_locked(a, (uintptr_t)ptr, out);
  api_unlock(a);
  return st;
}

/* ---- liveness ---- */

void _expseg_ipc_poll_locked(expseg_allocator *a) {
  struct ipc_state_s *S = a->ipc;
  if (!S || S->n_ex == 0) return;
  struct pollfd local[16];
  struct pollfd *p = S->n_ex <= 16 ? local : malloc(S->n_ex * sizeof *p);
  if (!p) return; /* tried again at the next call */
  for (size_t i = 0; i < S->n_ex; i++)
    p[i] = (struct pollfd){.fd = S->ex[i].sock, .events = POLLIN};
  if (poll(p, S->n_ex, 0) > 0) {
    /* nobody writes on the socket: readable or hung up means every importer is gone */
    size_t n = S->n_ex, k = 0;
    uintptr_t *to_free = malloc(n * sizeof *to_free);
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
      if (p[i].revents == 0 || (S->ex[i].freed && !to_free)) { /* no memory: next poll */
        S->ex[k++] = S->ex[i];
        continue;
      }
      close(S->ex[i].sock);
      if (S->ex[i].freed) to_free[nf++] = S->ex[i].ptr;
    }
    S->n_ex = k;
    for (size_t i = 0; i < nf; i++) {
      bool freed = false;
      if (!is_held(S, to_free[i], &freed)) (void)_expseg_free_locked(a, (void *)to_free[i]);
    }
    free(to_free);
  }
  if (p != local) free(p);
}

uintptr_t _expseg_ipc_held_in_pool(expseg_allocator *a, uint32_t tag) {
  _expseg_ipc_poll_locked(a);
  const struct ipc_state_s *S = a->ipc;
  for (size_t i = 0; S && i < S->n_ex; i++) {
    const block_t *b = _expseg_ptrmap_get(&a->live, S->ex[i].ptr);
    if (b != NULL && seg_tag(b->seg) == tag) return S->ex[i].ptr;
  }
  return 0;
}

bool _expseg_ipc_freed(const expseg_allocator *a, uintptr_t ptr) {
  bool freed = false;
  return is_held(a->ipc, ptr, &freed) && freed;
}

bool _expseg_ipc_hold_free(expseg_allocator *a, uintptr_t ptr, expseg_status *st) {
  _expseg_ipc_poll_locked(a);
  struct ipc_state_s *S = a->ipc;
  bool freed = false;
  if (!is_held(S, ptr, &freed)) return false;
  if (freed) {
    *st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                            "expseg_free(%p): already freed (the free waits for the processes "
                            "that imported it)",
                            (void *)ptr);
    return true;
  }
  for (size_t i = 0; i < S->n_ex; i++)
    if (S->ex[i].ptr == ptr) S->ex[i].freed = true;
  *st = EXPSEG_OK;
  return true;
}

expseg_status expseg_ipc_poll(expseg_allocator *a, size_t *held) {
  if (!a)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_ipc_poll: the allocator is NULL");
  api_lock(a);
  _expseg_ipc_poll_locked(a);
  if (held) *held = a->ipc ? a->ipc->n_ex : 0;
  api_unlock(a);
  return EXPSEG_OK;
}

/* ---- import ---- */

static expseg_status bad(const char *what, uint64_t got, const char *expected) {
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_ipc_import: malformed handle: %s is %llu; expected %s", what,
                           (unsigned long long)got, expected);
}

/* Every check that needs no driver call. */
static expseg_status validate(const expseg_allocator *a, const expseg_ipc_handle *h) {
  if (!h->data || h->size < HDR) return bad("the handle size", h->size, "at least 64 bytes");
  const unsigned char *d = h->data;
  if (memcmp(d, "EXIP", 4) != 0)
    return bad("the magic (first 4 bytes, as a number)", getn(d, 4), "\"EXIP\"");
  if (getn(d + 4, 2) != VERSION) return bad("the version", getn(d + 4, 2), "1 (this library's)");
  if (getn(d + 6, 2) != HDR) return bad("the header size", getn(d + 6, 2), "64");
  if (getn(d + 8, 2) != ENT) return bad("the entry size", getn(d + 8, 2), "32");
  if (getn(d + 10, 2) != 0) return bad("the padding at byte 10", getn(d + 10, 2), "zero");
  if (getn(d + 48, 8) != 0)
    return bad("the padding or flags field at byte 48", getn(d + 48, 8), "zero");
  if (getn(d + 56, 8) != 0) return bad("the padding at byte 56", getn(d + 56, 8), "zero");
  uint64_t n = getn(d + 12, 4), nf = getn(d + 16, 4), live = getn(d + 20, 4);
  uint64_t extent = getn(d + 24, 8), off = getn(d + 32, 8), size = getn(d + 40, 8);
  if (n == 0 || n > MAX_CHUNKS) return bad("the chunk count", n, "1 to 2^20");
  if (h->size != HDR + n * ENT) return bad("the handle size", h->size, "64 + 32 x chunk count");
  if (nf != h->n_fds || nf < 1 || !h->fds)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_import: malformed handle: the descriptor count is %llu; "
                             "expected the descriptors received, %zu%s (at least the liveness one)",
                             (unsigned long long)nf, h->fds ? h->n_fds : 0,
                             h->fds ? "" : " (fds is NULL)");
  for (size_t i = 0; i < h->n_fds; i++)
    if (h->fds[i] < 0)
      return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                               "expseg_ipc_import: malformed handle: descriptor %zu is %d; "
                               "expected an open descriptor",
                               i, h->fds[i]);
  if (live >= nf) return bad("the liveness descriptor index", live, "below the descriptor count");
  size_t g = a->granularity;
  if (extent == 0 || extent % g || extent > (UINT64_C(1) << 50))
    return bad("the extent", extent, "a non-zero multiple of this device's granularity, < 2^50");
  if (size == 0 || off > extent || size > extent - off)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_import: malformed handle: the allocation is %llu bytes at "
                             "offset %llu; expected a non-empty range inside the extent, %llu",
                             (unsigned long long)size, (unsigned long long)off,
                             (unsigned long long)extent);
  uint64_t at = 0;
  for (uint64_t i = 0; i < n; i++) {
    const unsigned char *e = d + HDR + i * ENT;
    uint64_t idx = getn(e, 4), fo = getn(e + 8, 8), eo = getn(e + 16, 8), es = getn(e + 24, 8);
    if (idx >= nf || idx == live)
      return bad("a chunk's descriptor index", idx, "a chunk descriptor");
    if (getn(e + 4, 4) != 0) return bad("a chunk entry's padding", getn(e + 4, 4), "zero");
    if (eo != at) return bad("a chunk's offset in the extent", eo, "the end of the previous chunk");
    if (es == 0 || es % g || es > extent - at)
      return bad("a chunk's size", es, "a non-zero multiple of the granularity inside the extent");
    if (fo > UINT64_MAX - es) return bad("a chunk's file offset", fo, "offset + size < 2^64");
    at += es;
  }
  if (at != extent) return bad("the chunks' total size", at, "the extent");
  int type = 0;
  socklen_t tl = sizeof type;
  if (getsockopt(h->fds[live], SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) {
    const bool got = type != 0; /* a socket of another type; else not a socket, or closed */
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_import: malformed handle: the liveness descriptor "
                             "(index %llu, descriptor %d) is %s%s; expected the exporter's "
                             "stream socket",
                             (unsigned long long)live, h->fds[live],
                             got ? "a socket of another type than SOCK_STREAM" : "not a socket: ",
                             got ? "" : strerror(errno));
  }
  /* the exporter's end closed: it was destroyed or exited, the allocation is not live */
  struct pollfd pf = {.fd = h->fds[live], .events = POLLRDHUP};
  if (poll(&pf, 1, 0) == 1 && (pf.revents & (POLLHUP | POLLRDHUP)))
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_import: stale handle: the exporter's end of its liveness "
                             "socket (descriptor %d) is closed (the exporting allocator was "
                             "destroyed or its process exited); expected a handle of a live export",
                             h->fds[live]);
  return EXPSEG_OK;
}

/* Gives back what im holds (mappings, chunks, reservation, liveness descriptor), recording
 * each step; stops at the first refusal, leaving im consistent for a later retry. */
static expseg_status teardown(expseg_allocator *a, import_t *im) {
  if (im->mapped) {
    size_t bytes = 0;
    for (size_t i = 0; i < im->mapped; i++) bytes += im->sizes[i];
    expseg_status st = _expseg_vmm_unmap(a->drv, im->base, bytes);
    if (st) return st;
    im->mapped = 0;
  }
  for (size_t i = 0; i < im->n; i++) {
    if (!im->h[i]) continue;
    expseg_status st = _expseg_vmm_release(a->drv, im->h[i], im->sizes[i]);
    if (st) return st;
    im->h[i] = 0;
  }
  if (im->reserved) {
    expseg_status st = _expseg_vmm_unreserve(a->drv, im->base, im->extent);
    if (st) return st;
    im->reserved = false;
  }
  if (im->live >= 0) close(im->live);
  im->live = -1;
  free(im->h), free(im->sizes);
  im->h = NULL, im->sizes = NULL;
  return EXPSEG_OK;
}

/* Retries the teardown of failed imports a driver refusal left behind. */
static void retry_orphans(expseg_allocator *a) {
  struct ipc_state_s *S = a->ipc;
  for (size_t i = 0; S && i < S->n_im;) {
    if (S->im[i].ptr == 0 && teardown(a, &S->im[i]) == EXPSEG_OK)
      S->im[i] = S->im[--S->n_im];
    else
      i++;
  }
}

/* A failed import (status st, its message set): gives back what it holds; what the driver
 * refuses stays as an orphan. Returns st with the import's message. */
static expseg_status undo_import(expseg_allocator *a, struct ipc_state_s *S, import_t *im,
                                 expseg_status st) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", expseg_last_error());
  if (teardown(a, im) != EXPSEG_OK) {
    im->ptr = 0;
    S->im[S->n_im++] = *im; /* room made before the first driver call */
  }
  return _expseg_error_set(st, "%s", msg);
}

static expseg_status import_locked(expseg_allocator *a, const expseg_ipc_handle *hd, void **ptr) {
  expseg_status st = validate(a, hd);
  if (st) return st;
  const unsigned char *d = hd->data;
  size_t n = (size_t)getn(d + 12, 4);
  import_t im = {.extent = (size_t)getn(d + 24, 8), .n = n, .live = -1};
  im.h = calloc(n, sizeof *im.h);
  im.sizes = calloc(n, sizeof *im.sizes);
  struct ipc_state_s *S = state(a);
  if (!im.h || !im.sizes || !S || !grow((void **)&S->im, &S->cap_im, S->n_im, sizeof *S->im)) {
    free(im.h), free(im.sizes);
    return no_memory("expseg_ipc_import");
  }
  im.live = fcntl(hd->fds[getn(d + 20, 4)], F_DUPFD_CLOEXEC, 0);
  if (im.live < 0) {
    st = _expseg_error_set(EXPSEG_ERR_DRIVER, "expseg_ipc_import: dup failed: %s", strerror(errno));
    return undo_import(a, S, &im, st);
  }
  st = _expseg_vmm_reserve(a->drv, im.extent, 0, &im.base);
  if (st) return undo_import(a, S, &im, st);
  im.reserved = true;
  for (size_t i = 0; i < n && st == EXPSEG_OK; i++) {
    const unsigned char *e = d + HDR + i * ENT;
    im.sizes[i] = (size_t)getn(e + 24, 8);
    st = _expseg_vmm_import_fd(a->drv, hd->fds[getn(e, 4)], (size_t)getn(e + 8, 8), im.sizes[i],
                               &im.h[i]);
    if (st == EXPSEG_OK)
      st = _expseg_vmm_map(a->drv, im.base + (size_t)getn(e + 16, 8), im.sizes[i], im.h[i], 0);
    if (st == EXPSEG_OK) im.mapped++;
  }
  if (st == EXPSEG_OK) st = _expseg_vmm_set_access(a->drv, im.base, im.extent);
  if (st == EXPSEG_OK && a->peers) st = _expseg_peers_grant(a, im.base, im.extent);
  if (st) {
    _expseg_error_set(st, "expseg_ipc_import: %s", expseg_last_error());
    return undo_import(a, S, &im, st);
  }
  im.ptr = im.base + (size_t)getn(d + 32, 8);
  S->im[S->n_im++] = im;
  *ptr = (void *)im.ptr;
  return EXPSEG_OK;
}

expseg_status expseg_ipc_import(expseg_allocator *a, const expseg_ipc_handle *h, void **ptr) {
  if (!a || !h || !ptr)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_import: the allocator, handle or out-pointer is NULL");
  *ptr = NULL;
  api_lock(a);
  retry_orphans(a);
  expseg_status st = import_locked(a, h, ptr);
  api_unlock(a);
  return st;
}

expseg_status expseg_ipc_close(expseg_allocator *a, void *ptr) {
  if (!a)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_close: the allocator is NULL");
  api_lock(a);
  retry_orphans(a);
  struct ipc_state_s *S = a->ipc;
  size_t i = 0;
  while (S && ptr && i < S->n_im && S->im[i].ptr != (uintptr_t)ptr) i++;
  if (!S || !ptr || i == S->n_im) {
    api_unlock(a);
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_close(%p): not a pointer expseg_ipc_import returned "
                             "(or already closed)",
                             ptr);
  }
  expseg_status st = teardown(a, &S->im[i]);
  if (st == EXPSEG_OK)
    S->im[i] = S->im[--S->n_im];
  else /* kept, with what is given back recorded: a second close goes on from there */
    st = _expseg_error_set(st, "expseg_ipc_close(%p): %s (the import stays open: close it again)",
                           ptr, expseg_last_error());
  api_unlock(a);
  return st;
}

expseg_status _expseg_ipc_foreach_import(expseg_allocator *a,
                                         expseg_status (*fn)(void *, uintptr_t, size_t),
                                         void *ctx) {
  for (size_t i = 0; a->ipc && i < a->ipc->n_im; i++) {
    if (a->ipc->im[i].mapped != a->ipc->im[i].n) continue; /* half closed: nothing mapped */
    expseg_status st = fn(ctx, a->ipc->im[i].base, a->ipc->im[i].extent);
    if (st) return st;
  }
  return EXPSEG_OK;
}

void _expseg_ipc_totals(const expseg_allocator *a, int64_t t[4]) {
  for (size_t i = 0; a->ipc && i < a->ipc->n_im; i++) {
    const import_t *im = &a->ipc->im[i];
    for (size_t c = 0; c < im->n; c++) {
      if (c < im->mapped) t[0] += (int64_t)im->sizes[c];
      if (im->h[c]) t[1]++, t[2] += (int64_t)im->sizes[c];
    }
    if (im->reserved) t[3] += (int64_t)im->extent;
  }
}

void _expseg_ipc_destroy(expseg_allocator *a) {
  struct ipc_state_s *S = a->ipc;
  if (!S) return;
  for (size_t i = 0; i < S->n_ex; i++) close(S->ex[i].sock);
  for (size_t i = 0; i < S->n_im; i++) { /* what the driver refuses here is reported by it */
    if (teardown(a, &S->im[i]) != EXPSEG_OK) {
      if (S->im[i].live >= 0) close(S->im[i].live);
      free(S->im[i].h), free(S->im[i].sizes);
    }
  }
  free(S->ex), free(S->im), free(S);
  a->ipc = NULL;
}

/* ---- handles ---- */

expseg_status expseg_ipc_send(int socket_fd, const expseg_ipc_handle *h) {
  if (!h || !h->data || (h->n_fds && !h->fds))
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_ipc_send: empty handle");
  return _expseg_ipc_sock_send(socket_fd, h->data, h->size, h->fds, h->n_fds);
}

expseg_status expseg_ipc_recv(int socket_fd, expseg_ipc_handle *out) {
  if (!out) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_ipc_recv: out is NULL");
  memset(out, 0, sizeof *out);
  return _expseg_ipc_sock_recv(socket_fd, &out->data, &out->size, &out->fds, &out->n_fds);
}

void expseg_ipc_handle_free(expseg_ipc_handle *h) {
  if (!h) return;
  for (size_t i = 0; h->fds && i < h->n_fds; i++)
    if (h->fds[i] >= 0) close(h->fds[i]);
  free(h->fds), free(h->data);
  memset(h, 0, sizeof *h);
}
