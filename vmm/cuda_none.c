/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_none.c: the cuda backend of a build without cuda.h: always unsupported (so
 * expseg_create(NULL, ...) fails with this reason unless $EXPSEG_DRIVER names a driver).
 * Compiled instead of cuda.c. */
#include "vmm_impl.h"

expseg_status _expseg_cuda_new(int device, expseg_vmm_t **out) {
  (void)device;
  if (out) *out = NULL;
  return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                           "expseg was built without CUDA support (cuda.h not found at build "
                           "time); rebuild with -DEXPSEG_WITH_CUDA=ON and CUDA_HOME set, or use "
                           "the host or sim driver");
}

bool _expseg_cuda_usable(int device) {
  (void)device;
  return false;
}
