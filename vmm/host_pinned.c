/* SPDX-License-Identifier: Apache-2.0 */
/* host_pinned.c: pinned host memory for the host and sim backends, and the pre-faulting
 * threads every backend's register path uses.
 *
 * A chunk is an anonymous private mapping. Both paths bind it to the asked NUMA node
 * first (hwloc_set_area_membind = mbind(MPOL_BIND): real, so placement is testable), then
 * fault every page in, then lock it:
 *  - register path (pinned_use_cuda_host_register): the pages are touched by
 *    `fault_threads` threads, each bound to the node's cores, then mlock()ed: the stand-in
 *    for malloc + pre-fault + cuMemHostRegister;
 *  - create path: the stand-in for cuMemCreate on a host NUMA location: the caller's thread
 *    faults the pages in, then mlock().
 * Page locking is modelled, not required: mlock fails past RLIMIT_MEMLOCK (8 MiB for an
 * unprivileged user by default), and then the chunk says locked = false (the pages are
 * present all the same), and one warning per process says why.
 * Before the pages are faulted in, a chunk of 4 MiB or more is advised to use transparent
 * huge pages (madvise MADV_HUGEPAGE) unless the caller says no_huge (pinned_huge_pages). */
#include "vmm_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static size_t os_page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

#define PREFAULT_THREAD_MIN ((size_t)2 << 20) /* one bound thread only from 2 MiB up */
#define HUGE_MIN ((size_t)4 << 20)            /* huge pages asked from two of them up */

typedef struct {
  volatile char *lo, *hi; /* this thread's share, page aligned */
  int node;
  size_t page;
} fault_job_t;

/* MADV_POPULATE_WRITE (Linux 5.14+) faults the range in one call; older kernels refuse
 * it (EINVAL) and the pages are touched one by one. */
static void touch(const fault_job_t *j) {
#ifdef MADV_POPULATE_WRITE
  if (j->hi > j->lo && madvise((void *)j->lo, (size_t)(j->hi - j->lo), MADV_POPULATE_WRITE) == 0)
    return;
#endif
  for (volatile char *p = j->lo; p < j->hi; p += j->page) *p = 0;
}

static void *fault_thread(void *arg) {
  fault_job_t *j = arg;
  if (j->node >= 0) (void)_expseg_topo_bind_thread(j->node); /* speed only: mbind places */
  touch(j);
  return NULL;
}

uint32_t _expseg_pinned_prefault(void *p, size_t size, uint32_t n, int node, bool huge) {
  size_t page = os_page(), pages = size / page;
#ifdef MADV_HUGEPAGE
  /* Transparent huge pages where the system allows them (a hint: refused or ignored where
   * they are off): a fault per 2 MiB instead of per 4 KiB, and fewer pages to lock. */
  if (huge && size >= HUGE_MIN) (void)madvise(p, size, MADV_HUGEPAGE);
#else
  (void)huge;
#endif
  if (n == 0) n = 1;
  if (n > pages) n = pages ? (uint32_t)pages : 1;
  fault_job_t jobs[128];
  pthread_t tid[128];
  uint32_t started = 0;
  for (uint32_t i = 0; i < n && i < 128; i++) {
    jobs[i].lo = (char *)p + pages * i / n * page;
    jobs[i].hi = (char *)p + pages * (i + 1) / n * page;
    jobs[i].node = node;
    jobs[i].page = page;
  }
  /* One share and nothing to bind, or too small for a thread start (tens of us) to pay:
   * the caller does it (placement is the memory binding's job, not the thread's). */
  if (n == 1 && (node < 0 || size < PREFAULT_THREAD_MIN)) {
    touch(&jobs[0]);
    return 0;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (pthread_create(&tid[i], NULL, fault_thread, &jobs[i]) != 0) {
      touch(&jobs[i]); /* no thread: the caller takes the share */
      tid[i] = 0;
      continue;
    }
    started++;
  }
  for (uint32_t i = 0; i < n; i++)
    if (tid[i]) pthread_join(tid[i], NULL);
  return started;
}

static atomic_bool lock_warned, bind_warned; /* one warning per process each */

expseg_status _expseg_pinned_alloc(void *st, expseg_host_chunk_t *c) {
  (void)st;
  void *p = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    char b[32];
    int err = errno;
    return _expseg_error_set(err == ENOMEM ? EXPSEG_ERR_OUT_OF_MEMORY : EXPSEG_ERR_DRIVER,
                             "pinned host memory: mmap of %s failed: %s",
                             _expseg_format_size(b, c->size), strerror(err));
  }
  c->ptr = p;
  c->method = c->use_register ? EXPSEG_HOST_REGISTERED : EXPSEG_HOST_CREATED;
  if (c->numa_node >= 0) {
    c->placed = _expseg_topo_bind(p, c->size, c->numa_node) == EXPSEG_OK;
    if (!c->placed && !atomic_exchange(&bind_warned, true))
      _expseg_warn("pinned host memory: not placed on NUMA node %d (%s); the memory is "
                   "usable, placement is left to the OS (expseg.placed_bytes counts what is "
                   "placed)",
                   c->numa_node, _expseg_error_message());
  }
  if (c->use_register)
    c->threads_used =
        _expseg_pinned_prefault(p, c->size, c->fault_threads, c->numa_node, !c->no_huge);
  else /* mlock may not fault (sanitizers stub it) */
    _expseg_pinned_prefault(p, c->size, 1, -1, !c->no_huge);
  c->locked = mlock(p, c->size) == 0;
  if (!c->locked) {
    int err = errno;
    if (!atomic_exchange(&lock_warned, true)) {
      struct rlimit rl = {0, 0};
      getrlimit(RLIMIT_MEMLOCK, &rl);
      _expseg_warn("pinned host memory is not page-locked: mlock failed (%s; "
                   "RLIMIT_MEMLOCK %llu bytes); the memory is usable, locking is modelled",
                   strerror(err), (unsigned long long)rl.rlim_cur);
    }
  }
  return EXPSEG_OK;
}

expseg_status _expseg_pinned_free(void *st, const expseg_host_chunk_t *c) {
  (void)st;
  if (munmap(c->ptr, c->size) != 0)
    return _expseg_error_set(EXPSEG_ERR_DRIVER, "pinned host memory: free(%p): munmap failed: %s",
                             c->ptr, strerror(errno));
  return EXPSEG_OK; /* munmap drops the lock too */
}
