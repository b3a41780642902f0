/* SPDX-License-Identifier: Apache-2.0 */
/* info.c: identity calls of the public API: the library's version, the driver and device an
 * allocator runs on, and the device's free/total memory as cudaMemGetInfo reports it. Each
 * reads fields fixed at creation, or asks the driver (mem_get_info), so none takes the
 * allocator's lock. */
#include "error.h"
#include "internal.h"

#define EXPSEG_STR_(x) #x
#define EXPSEG_STR(x) EXPSEG_STR_(x)

const char *expseg_version(void) {
  return EXPSEG_STR(EXPSEG_VERSION_MAJOR) "." EXPSEG_STR(EXPSEG_VERSION_MINOR) "." EXPSEG_STR(
      EXPSEG_VERSION_PATCH);
}

const char *expseg_driver_name(const expseg_allocator *a) {
  return a ? a->drv->ops->name : "";
}

expseg_status expseg_get_info(const expseg_allocator *a, expseg_info *info) {
  if (a == NULL || info == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_get_info: %s is NULL",
                             a ? "info" : "the allocator");
  info->driver = a->drv->ops->name;
  info->device = a->device;
  info->total_memory = a->total_mem;
  info->granularity = a->granularity;
  info->page_size = a->page;
  return EXPSEG_OK;
}

expseg_status expseg_mem_get_info(expseg_allocator *a, size_t *free_bytes, size_t *total_bytes) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_mem_get_info: the allocator is NULL");
  _expseg_vmm_mem_info(a->drv, free_bytes, total_bytes);
  return EXPSEG_OK;
}
