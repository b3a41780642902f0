// SPDX-License-Identifier: Apache-2.0
// expseg_torch_raise.cpp: expseg_torch_alloc_raising, the allocation function the Python route
// gives torch.cuda.memory.CUDAPluggableAllocator. PyTorch's pluggable allocator does not check
// the pointer its alloc function returns: a NULL from expseg_torch_alloc became a tensor with no
// memory, and the first kernel to touch it faulted far from the cause. This entry point throws
// instead (a C++ exception, which PyTorch turns into a Python RuntimeError carrying expseg's
// message), so the failing allocation itself raises. It is the only C++ in libexpseg_torch.so;
// the C entry points keep their NULL-and-message contract for C callers (CuPy, Numba, tests).
#include <stdexcept>
#include <string>

#include "expseg_torch.h"

extern "C" EXPSEG_EXPORT void *expseg_torch_alloc_raising(size_t size, int device, void *stream) {
  void *p = expseg_torch_alloc(size, device, stream);
  if (p == nullptr && size > 0) {
    const char *why = expseg_torch_last_error(device);
    throw std::runtime_error(std::string("CUDA out of memory (expseg): ") +
                             (why && *why ? why : "the allocation failed"));
  }
  return p;
}
