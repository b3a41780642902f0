// SPDX-License-Identifier: Apache-2.0
// test_gpu_busy.cpp: the busy-memory random run of test_alloc_busy.cpp on the cuda backend
// against the CUDA driver double (label gpu; skips when libcuda.so.1 is not the double: the
// run writes and checks block data from the CPU, which only the double's memory allows).
#define EXPSEG_ALLOC_BUSY_GPU 1
#include "test_alloc_busy.cpp"
