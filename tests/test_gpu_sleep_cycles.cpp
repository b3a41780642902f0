// SPDX-License-Identifier: Apache-2.0
// test_gpu_sleep_cycles.cpp: the tests of test_alloc_sleep_cycles.cpp on the cuda backend
// against the CUDA driver double (label gpu; skips when libcuda.so.1 is not the double).
#define EXPSEG_SLEEP_GPU 1
#include "test_alloc_sleep_cycles.cpp"
