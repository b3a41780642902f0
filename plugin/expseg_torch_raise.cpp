// SPDX-License-Identifier: Apache-2.0
// expseg_torch_raise.cpp: expseg_torch_alloc_raising, the allocation function the Python route
// gives torch.cuda.memory.CUDAPluggableAllocator. PyTorch's pluggable allocator does not check
// the pointer its alloc function returns: a NULL from expseg_torch_alloc became a tensor with no
// memory, and the first kernel to touch it faulted far from the cause. This entry point throws
// instead (a C++ exception, which PyTorch turns into a Python RuntimeError carrying expseg's
// message), so the failing allocation itself raises. It is the only C++ in libexpseg_torch.so;
// the C entry points keep their NULL-and-message contract for C callers (CuPy, Numba, tests).
// Only an allocation that ran out of memory says "CUDA out of memory"; any other failure (a
// bad configuration, a device PyTorch does not have, the driver) names its status instead.
#include <stdexcept>
#include <string>

#include "expseg_torch.h"

extern "C" EXPSEG_EXPORT void *expseg_torch_alloc_raising(size_t size, int device, void *stream) {
  void *p = expseg_torch_alloc(size, device, stream);
  if (p == nullptr && size > 0) {
    const char *why = expseg_torch_last_error(device);
    const int st = expseg_torch_alloc_status();
    const std::string head = st == EXPSEG_ERR_OUT_OF_MEMORY
                                 ? "CUDA out of memory (expseg): "
                                 : std::string("expseg could not allocate (") +
                                       expseg_status_name((expseg_status)st) + "): ";
    throw std::runtime_error(head + (why && *why ? why : "the allocation failed"));
  }
  return p;
}
