/* SPDX-License-Identifier: Apache-2.0 */
/* memory.c: the CUDA driver double's device memory (tests only; includes cuda.h). Device
 * memory is real host memory so data can be checked: each allocation (cuMemCreate) is a
 * memfd of its size, a reservation (cuMemAddressReserve) is a PROT_NONE mapping of anonymous
 * memory, cuMemMap maps the memfd over it with PROT_NONE (nothing can touch it yet),
 * cuMemSetAccess makes it readable and writable, cuMemUnmap puts a PROT_NONE reservation
 * back. An exported handle is a duplicate of the memfd, so it works across fork, exec and
 * SCM_RIGHTS. Every precondition the driver API documentation states is checked first and
 * refused with the driver's own code; docs/driver.md lists them. */
#include "double.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define RW (PROT_READ | PROT_WRITE)

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static dbl_alloc *find_alloc(CUmemGenericAllocationHandle h, size_t *idx) {
  for (size_t i = 0; i < g.allocs.n; i++) {
    dbl_alloc *a = g.allocs.v[i];
    if (a->id == h && !a->released) {
      if (idx) *idx = i;
      return a;
    }
  }
  return NULL;
}

static void free_alloc(dbl_alloc *a) {
  for (size_t i = 0; i < g.allocs.n; i++) {
    if (g.allocs.v[i] == a) {
      dbl_vec_remove(&g.allocs, i);
      break;
    }
  }
  if (!a->imported) g.dev[a->dev].used -= (int64_t)a->size;
  close(a->fd);
  free(a);
}

static dbl_range *find_range(uintptr_t p, size_t n) {
  for (size_t i = 0; i < g.ranges.n; i++) {
    dbl_range *r = g.ranges.v[i];
    if (p >= r->base && n <= r->size && p - r->base <= r->size - n) return r;
  }
  return NULL;
}

/* the mapping that contains p, and its index */
static dbl_map *map_at(uintptr_t p, size_t *idx) {
  for (size_t i = 0; i < g.maps.n; i++) {
    dbl_map *m = g.maps.v[i];
    if (p >= m->va && p - m->va < m->size) {
      if (idx) *idx = i;
      return m;
    }
  }
  return NULL;
}

/* [p, p+n) is exactly a run of whole, adjacent mappings: their number, else 0 */
static size_t whole_mappings(uintptr_t p, size_t n) {
  size_t k = 0;
  uintptr_t at = p;
  while (at - p < n) {
    dbl_map *m = map_at(at, NULL);
    if (!m || m->va != at || m->size > n - (at - p)) return 0;
    at += m->size;
    k++;
  }
  return n ? k : 0;
}

bool dbl_accessible(uintptr_t p, size_t n, int dev) {
  for (size_t i = 0; i < g.hostregs.n; i++) {
    dbl_range *r = g.hostregs.v[i];
    if (p >= r->base && n <= r->size && p - r->base <= r->size - n) return true;
  }
  uintptr_t at = p;
  while (at - p < n) {
    dbl_map *m = map_at(at, NULL);
    if (!m || !(m->access & (1u << dev))) return false;
    at = m->va + m->size;
  }
  return true;
}

bool dbl_memory_idle(void) {
  return !g.allocs.n && !g.ranges.n && !g.maps.n && !g.hostregs.n;
}

void dbl_counts_memory(cudadouble_state *o) {
  for (size_t i = 0; i < g.allocs.n; i++) {
    const dbl_alloc *a = g.allocs.v[i];
    if (a->released) o->freed_late++;
    else o->handles++;
  }
  o->reservations = (int64_t)g.ranges.n;
  o->mappings = (int64_t)g.maps.n;
  o->host_registrations = (int64_t)g.hostregs.n;
}

/* A device location of the allocation API (prop->location, an access descriptor's). */
static CUresult check_location(const char *call, const CUmemLocation *l) {
  if (l->type != CU_MEM_LOCATION_TYPE_DEVICE)
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                      "%s: location type %d: the double models device memory only "
                      "(CU_MEM_LOCATION_TYPE_DEVICE)",
                      call, (int)l->type);
  if (l->id < 0 || l->id >= g.cfg.devices)
    return dbl_refuse(CUDA_ERROR_INVALID_DEVICE, "%s: location id %d: %d device(s)", call, l->id,
                      g.cfg.devices);
  return CUDA_SUCCESS;
}

static CUresult check_prop(const char *call, const CUmemAllocationProp *p) {
  if (!p) return dbl_refuse(CUDA_ERROR_INVALID_VALUE, "%s: prop is NULL", call);
  if (p->type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                      "%s: prop.type %d: only CU_MEM_ALLOCATION_TYPE_PINNED exists", call,
                      (int)p->type);
  CUresult r = check_location(call, &p->location);
  if (r != CUDA_SUCCESS) return r;
  if (p->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
      !(p->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && g.cfg.fd))
    return dbl_refuse(CUDA_ERROR_NOT_SUPPORTED,
                      "%s: requestedHandleTypes 0x%x: supported are NONE%s", call,
                      (unsigned)p->requestedHandleTypes,
                      g.cfg.fd ? " and POSIX_FILE_DESCRIPTOR" : " (fd=0)");
  if (p->win32HandleMetaData)
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                      "%s: win32HandleMetaData must be zero without a WIN32 handle type", call);
  static const unsigned char zero[sizeof p->allocFlags];
  if (memcmp(&p->allocFlags, zero, sizeof zero) != 0)
    return dbl_refuse(CUDA_ERROR_NOT_SUPPORTED,
                      "%s: allocFlags (compression, RDMA, usage) are not modelled by the double",
                      call);
  return CUDA_SUCCESS;
}

DBL_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *gran,
                                                          const CUmemAllocationProp *prop,
                                                          CUmemAllocationGranularity_flags o) {
  BEGIN("cuMemGetAllocationGranularity");
  if (!gran) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "%s: granularity is NULL", call_.name));
  CUresult r = check_prop(call_.name, prop);
  if (r != CUDA_SUCCESS) END(r);
  if (o == CU_MEM_ALLOC_GRANULARITY_MINIMUM) *gran = g.cfg.granularity;
  else if (o == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) *gran = g.cfg.recommended;
  else END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "%s: option %d: MINIMUM or RECOMMENDED",
                      call_.name, (int)o));
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                        const CUmemAllocationProp *prop,
                                        unsigned long long flags) {
  BEGIN_ARGS("cuMemCreate", 0, size, 0);
  NEED_CTX(ctx);
  (void)ctx;
  char b[32];
  if (!handle) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: handle is NULL"));
  if (flags) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: flags must be zero"));
  CUresult r = check_prop(call_.name, prop);
  if (r != CUDA_SUCCESS) END(r);
  if (size == 0 || size % g.cfg.granularity)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemCreate(size=%zu): not a multiple of the minimum granularity %zu", size,
                   g.cfg.granularity));
  int d = prop->location.id;
  if (size > g.cfg.capacity - (size_t)g.dev[d].used)
    END(dbl_refuse(CUDA_ERROR_OUT_OF_MEMORY,
                   "cuMemCreate(%s) on device %d: capacity %zu, %lld in use", dbl_size(b, size),
                   d, g.cfg.capacity, (long long)g.dev[d].used));
  char name[32];
  snprintf(name, sizeof name, "cudadouble-d%d", d);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    END(dbl_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate: memfd: %s", strerror(e)));
  }
  dbl_alloc *a = calloc(1, sizeof *a);
  if (!a) abort();
  *a = (dbl_alloc){.id = g.next_handle++, .size = size, .dev = d, .fd = fd,
                   .fd_export = prop->requestedHandleTypes ==
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
  dbl_vec_push(&g.allocs, a);
  g.dev[d].used += (int64_t)size;
  *handle = a->id;
  call_.handle = a->id;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle h) {
  BEGIN_ARGS("cuMemRelease", 0, 0, h);
  dbl_alloc *a = find_alloc(h, NULL);
  if (!a)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemRelease(0x%llx): not a live handle (never created, or released)", h));
  call_.size = a->size;
  a->released = true;
  if (a->maps == 0) free_alloc(a); /* else freed by the last cuMemUnmap */
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align,
                                                CUdeviceptr addr, unsigned long long flags) {
  BEGIN_ARGS("cuMemAddressReserve", 0, size, 0);
  NEED_CTX(ctx);
  (void)ctx;
  size_t pg = page_size();
  if (!ptr) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: ptr is NULL"));
  if (flags) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: flags must be zero"));
  if (size == 0 || size % pg || addr % pg)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemAddressReserve(size=%zu, addr=0x%llx): size and addr must be multiples "
                   "of the host page size (%zu), size non-zero",
                   size, addr, pg));
  if (align & (align - 1))
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemAddressReserve(alignment=%zu): a power of two or zero", align));
  size_t al = align > g.cfg.granularity ? align : g.cfg.granularity;
  if (size > SIZE_MAX - al)
    END(dbl_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve(size=%zu): too large", size));
  /* the hint is a hint: ignored */
  void *p = mmap(NULL, size + al, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    END(dbl_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve(size=%zu): mmap: %s", size,
                   strerror(errno)));
  uintptr_t base = ((uintptr_t)p + al - 1) & ~(uintptr_t)(al - 1);
  if (base > (uintptr_t)p) munmap(p, base - (uintptr_t)p);
  uintptr_t end = (uintptr_t)p + size + al;
  if (end > base + size) munmap((void *)(base + size), end - (base + size));
  dbl_range *r = malloc(sizeof *r);
  if (!r) abort();
  *r = (dbl_range){base, size};
  dbl_vec_push(&g.ranges, r);
  *ptr = (CUdeviceptr)base;
  call_.addr = base;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  BEGIN_ARGS("cuMemAddressFree", ptr, size, 0);
  for (size_t i = 0; i < g.ranges.n; i++) {
    dbl_range *r = g.ranges.v[i];
    if (r->base != ptr) continue;
    if (r->size != size)
      END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                     "cuMemAddressFree(0x%llx, %zu): the reservation's size is %zu", ptr, size,
                     r->size));
    for (size_t k = 0; k < g.maps.n; k++) {
      const dbl_map *m = g.maps.v[k];
      if (m->va >= r->base && m->va - r->base < r->size)
        END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                       "cuMemAddressFree(0x%llx, %zu): 0x%lx is still mapped (the documentation "
                       "does not say a mapped range may be freed: the double refuses)",
                       ptr, size, (unsigned long)m->va));
    }
    munmap((void *)r->base, r->size);
    dbl_vec_remove(&g.ranges, i);
    free(r);
    END(CUDA_SUCCESS);
  }
  END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                 "cuMemAddressFree(0x%llx, %zu): not an address cuMemAddressReserve returned",
                 ptr, size));
}

DBL_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                     CUmemGenericAllocationHandle h, unsigned long long flags) {
  BEGIN_ARGS("cuMemMap", ptr, size, h);
  NEED_CTX(ctx);
  (void)ctx;
  size_t gr = g.cfg.granularity;
  if (flags) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: flags must be zero"));
  if (offset)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(offset=%zu): the offset must be zero",
                   offset));
  dbl_alloc *a = find_alloc(h, NULL);
  if (!a) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: handle 0x%llx is not live", h));
  if (size == 0 || size % gr || ptr % gr)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemMap(0x%llx, %zu): address and size must be multiples of the minimum "
                   "granularity %zu",
                   ptr, size, gr));
  if (size > a->size)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemMap(size=%zu): past the end of the allocation (%zu bytes)", size,
                   a->size));
  if (!find_range(ptr, size))
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemMap(0x%llx, %zu): not inside one address reservation", ptr, size));
  for (size_t i = 0; i < g.maps.n; i++) {
    const dbl_map *m = g.maps.v[i];
    if (m->va < ptr + size && ptr < m->va + m->size)
      END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                     "cuMemMap(0x%llx, %zu): overlaps the mapping at 0x%lx (%zu bytes): only "
                     "ranges that are not mapped can be mapped",
                     ptr, size, (unsigned long)m->va, m->size));
  }
  void *p = mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0);
  if (p == MAP_FAILED)
    END(dbl_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemMap: mmap: %s", strerror(errno)));
  dbl_map *m = malloc(sizeof *m);
  if (!m) abort();
  *m = (dbl_map){ptr, size, a, 0};
  dbl_vec_push(&g.maps, m);
  a->maps++;
  END(CUDA_SUCCESS);
}

void dbl_dma_done(void) {
  for (size_t i = 0; i < g.dma.n; i++) free(g.dma.v[i]);
  g.dma.n = 0;
}

DBL_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  BEGIN_ARGS("cuMemUnmap", ptr, size, 0);
  size_t k = whole_mappings(ptr, size);
  if (!k)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemUnmap(0x%llx, %zu): not the entire range of one or more mappings "
                   "(cuMemUnmap cannot unmap a sub-range, nor unmapped memory)",
                   ptr, size));
  if (dbl_copy_queued(ptr, size))
    END(dbl_refuse(CUDA_ERROR_ILLEGAL_STATE,
                   "cuMemUnmap(0x%llx, %zu): an asynchronous copy (cuMemcpyHtoDAsync / "
                   "DtoHAsync) to or from it is queued and its stream not yet synchronized",
                   ptr, size));
  for (size_t i = 0; i < g.dma.n; i++) {
    const dbl_range *r = g.dma.v[i];
    if (r->base < ptr + size && ptr < r->base + r->size)
      END(dbl_refuse(CUDA_ERROR_ILLEGAL_STATE,
                     "cuMemUnmap(0x%llx, %zu): a cuMemcpyHtoD from pageable host memory into "
                     "[0x%lx, +%zu) may still be in flight (it returns once the bytes are "
                     "staged, before the DMA lands): synchronize first (cuStreamSynchronize(0), "
                     "cuCtxSynchronize); on a GPU the DMA hits unmapped memory and the context "
                     "fails with CUDA_ERROR_LAUNCH_FAILED",
                     ptr, size, (unsigned long)r->base, r->size));
  }
  if (mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
           -1, 0) == MAP_FAILED)
    END(dbl_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemUnmap: mmap: %s", strerror(errno)));
  uintptr_t at = ptr;
  for (size_t j = 0; j < k; j++) {
    size_t idx = 0;
    dbl_map *m = map_at(at, &idx);
    at += m->size;
    dbl_vec_remove(&g.maps, idx);
    dbl_alloc *a = m->alloc;
    if (--a->maps == 0 && a->released) free_alloc(a);
    free(m);
  }
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                           const CUmemAccessDesc *desc, size_t count) {
  BEGIN_ARGS("cuMemSetAccess", ptr, size, 0);
  if (!desc || count == 0)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: no access descriptors"));
  size_t k = whole_mappings(ptr, size);
  if (!k)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemSetAccess(0x%llx, %zu): not a fully mapped range of whole mappings",
                   ptr, size));
  for (size_t i = 0; i < count; i++) {
    CUresult r = check_location(call_.name, &desc[i].location);
    if (r != CUDA_SUCCESS) END(r);
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      END(dbl_refuse(CUDA_ERROR_NOT_SUPPORTED,
                     "cuMemSetAccess: flags %d: the double models PROT_NONE and PROT_READWRITE",
                     (int)desc[i].flags));
    for (uintptr_t at = ptr; at - ptr < size;) {
      const dbl_map *m = map_at(at, NULL);
      if (desc[i].location.id != m->alloc->dev && !g.cfg.peer)
        END(dbl_refuse(CUDA_ERROR_INVALID_DEVICE,
                       "cuMemSetAccess: device %d cannot access device %d's memory (peer=0)",
                       desc[i].location.id, m->alloc->dev));
      at = m->va + m->size;
    }
  }
  for (uintptr_t at = ptr; at - ptr < size;) {
    dbl_map *m = map_at(at, NULL);
    for (size_t i = 0; i < count; i++) {
      unsigned bit = 1u << desc[i].location.id;
      if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) m->access |= bit;
      else m->access &= ~bit;
    }
    mprotect((void *)m->va, m->size, m->access ? RW : PROT_NONE);
    at = m->va + m->size;
  }
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc,
                                           CUdeviceptr ptr) {
  BEGIN_ARGS("cuMemGetAccess", ptr, 0, 0);
  if (!flags || !loc) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAccess: NULL argument"));
  CUresult r = check_location(call_.name, loc);
  if (r != CUDA_SUCCESS) END(r);
  const dbl_map *m = map_at(ptr, NULL);
  if (!m) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAccess(0x%llx): not mapped", ptr));
  *flags = (m->access & (1u << loc->id)) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                         : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemGetInfo(size_t *fr, size_t *total) {
  BEGIN("cuMemGetInfo");
  NEED_CTX(ctx);
  if (!fr || !total) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetInfo: NULL argument"));
  *total = g.cfg.capacity;
  *fr = g.cfg.capacity - (size_t)g.dev[ctx->dev].used;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void *out,
                                                         CUmemGenericAllocationHandle h,
                                                         CUmemAllocationHandleType type,
                                                         unsigned long long flags) {
  BEGIN_ARGS("cuMemExportToShareableHandle", 0, 0, h);
  if (!out || flags)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemExportToShareableHandle: NULL output or non-zero flags"));
  dbl_alloc *a = find_alloc(h, NULL);
  if (!a) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemExportToShareableHandle(0x%llx): not live", h));
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !a->fd_export)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemExportToShareableHandle(0x%llx, type %d): the handle type must be one "
                   "requested at cuMemCreate (%s)",
                   h, (int)type, a->fd_export ? "POSIX_FILE_DESCRIPTOR" : "none"));
  int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    END(dbl_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemExportToShareableHandle: dup: %s",
                   strerror(errno)));
  *(int *)out = fd;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h,
                                                           void *os, CUmemAllocationHandleType type) {
  BEGIN("cuMemImportFromShareableHandle");
  NEED_CTX(ctx);
  (void)ctx;
  if (!h) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemImportFromShareableHandle: handle is NULL"));
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    END(dbl_refuse(CUDA_ERROR_NOT_SUPPORTED,
                   "cuMemImportFromShareableHandle(type %d): the double models POSIX fds",
                   (int)type));
  int fd = (int)(intptr_t)os, dev = -1;
  char link[64], target[128] = "";
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  struct stat st;
  if (n <= 0 || sscanf(target, "/memfd:cudadouble-d%d", &dev) != 1 || dev < 0 ||
      dev >= g.cfg.devices || fstat(fd, &st) != 0 || st.st_size <= 0)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemImportFromShareableHandle(fd %d): not a handle exported by "
                   "cuMemExportToShareableHandle of this double (%s)",
                   fd, n > 0 ? target : "not an open fd"));
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (mine < 0)
    END(dbl_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemImportFromShareableHandle: dup: %s",
                   strerror(errno)));
  dbl_alloc *a = calloc(1, sizeof *a);
  if (!a) abort();
  *a = (dbl_alloc){.id = g.next_handle++, .size = (size_t)st.st_size, .dev = dev, .fd = mine,
                   .imported = true, .fd_export = true};
  dbl_vec_push(&g.allocs, a);
  *h = a->id;
  call_.handle = a->id;
  call_.size = a->size;
  END(CUDA_SUCCESS);
}

/* ---- host memory ---- */

DBL_EXPORT CUresult CUDAAPI cuMemHostRegister(void *p, size_t n, unsigned int flags) {
  BEGIN_ARGS("cuMemHostRegister", (uintptr_t)p, n, 0);
  NEED_CTX(ctx);
  (void)ctx;
  unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                   CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (!p || n == 0 || (flags & ~known))
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister(%p, %zu, flags 0x%x)", p, n, flags));
  uintptr_t b = (uintptr_t)p;
  for (size_t i = 0; i < g.hostregs.n; i++) {
    const dbl_range *r = g.hostregs.v[i];
    if (r->base < b + n && b < r->base + r->size)
      END(dbl_refuse(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                     "cuMemHostRegister(%p, %zu): overlaps the registration at 0x%lx", p, n,
                     (unsigned long)r->base));
  }
  dbl_range *r = malloc(sizeof *r);
  if (!r) abort();
  *r = (dbl_range){b, n};
  dbl_vec_push(&g.hostregs, r);
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemHostUnregister(void *p) {
  BEGIN_ARGS("cuMemHostUnregister", (uintptr_t)p, 0, 0);
  NEED_CTX(ctx);
  (void)ctx;
  for (size_t i = 0; i < g.hostregs.n; i++) {
    dbl_range *r = g.hostregs.v[i];
    if (r->base == (uintptr_t)p) {
      call_.size = r->size;
      dbl_vec_remove(&g.hostregs, i);
      free(r);
      END(CUDA_SUCCESS);
    }
  }
  END(dbl_refuse(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                 "cuMemHostUnregister(%p): not the start of a registered range", p));
}

DBL_EXPORT CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned int flags) {
  BEGIN_ARGS("cuMemHostGetDevicePointer", (uintptr_t)p, 0, 0);
  NEED_CTX(ctx);
  (void)ctx;
  if (!d || flags)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuMemHostGetDevicePointer: NULL output or non-zero flags (must be 0)"));
  for (size_t i = 0; i < g.hostregs.n; i++) {
    const dbl_range *r = g.hostregs.v[i];
    if ((uintptr_t)p >= r->base && (uintptr_t)p - r->base < r->size) {
      *d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
      END(CUDA_SUCCESS);
    }
  }
  END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                 "cuMemHostGetDevicePointer(%p): not registered host memory", p));
}

/* ---- copies (synchronous; the double runs them at once) ---- */

static CUresult check_device_range(const char *call, int dev, uintptr_t p, size_t n) {
  if (n && !dbl_accessible(p, n, dev))
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                      "%s: [0x%lx, +%zu) is not memory device %d can access (unmapped, or no "
                      "cuMemSetAccess)",
                      call, (unsigned long)p, n, dev);
  return CUDA_SUCCESS;
}

#define CHECKED(call, dev, p, n)                                      \
  {                                                                   \
    CUresult rr_ = check_device_range(call, dev, (uintptr_t)(p), n); \
    if (rr_ != CUDA_SUCCESS) END(rr_);                                \
  }

bool dbl_host_pinned(const void *p, size_t n) {
  for (size_t i = 0; i < g.hostregs.n; i++) {
    const dbl_range *r = g.hostregs.v[i];
    if ((uintptr_t)p >= r->base && (uintptr_t)p - r->base + n <= r->size) return true;
  }
  return false;
}

/* From pageable memory the call returns once the bytes are staged and the DMA may still run
 * (the driver API's "API synchronization behavior"): the destination is recorded as in
 * flight, and an unmap of it before a synchronizing call is refused. From registered
 * (pinned) memory the copy is synchronous. Either way a stream sync comes first. */
DBL_EXPORT CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  BEGIN_ARGS("cuMemcpyHtoD", dst, n, 0);
  NEED_CTX(ctx);
  CHECKED(call_.name, ctx->dev, dst, n);
  dbl_dma_done();
  if (n) memcpy((void *)dst, src, n);
  if (n && !dbl_host_pinned(src, n)) {
    dbl_range *r = malloc(sizeof *r);
    if (!r) abort(); /* a test library: out of host memory ends the test */
    *r = (dbl_range){(uintptr_t)dst, n};
    dbl_vec_push(&g.dma, r);
  }
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  BEGIN_ARGS("cuMemcpyDtoH", src, n, 0);
  NEED_CTX(ctx);
  CHECKED(call_.name, ctx->dev, src, n);
  dbl_dma_done(); /* synchronous to the host, after a stream sync */
  if (n) memcpy(dst, (const void *)src, n);
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  BEGIN_ARGS("cuMemcpyDtoD", dst, n, 0);
  NEED_CTX(ctx);
  CHECKED(call_.name, ctx->dev, dst, n);
  CHECKED(call_.name, ctx->dev, src, n);
  dbl_dma_done();
  if (n) memmove((void *)dst, (const void *)src, n);
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
  BEGIN_ARGS("cuMemsetD8", dst, n, 0);
  NEED_CTX(ctx);
  CHECKED(call_.name, ctx->dev, dst, n);
  if (n) memset((void *)dst, v, n);
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n) {
  BEGIN_ARGS("cuMemsetD32", dst, n * 4, 0);
  NEED_CTX(ctx);
  if (dst % 4) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32(0x%llx): not 4-byte aligned", dst));
  if (n > SIZE_MAX / 4) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32: N too large"));
  CHECKED(call_.name, ctx->dev, dst, n * 4);
  for (size_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = v;
  END(CUDA_SUCCESS);
}
