// SPDX-License-Identifier: Apache-2.0
// test_gpu_sleep.cpp: the sleep and wake tests of test_alloc_sleep.cpp on the cuda backend
// against the CUDA driver double (label gpu; skips when libcuda.so.1 is not the double): its
// bytes are checked through cuMemcpyHtoD/DtoH of the double, under fault injection too.
#define EXPSEG_SLEEP_GPU 1
#include "test_alloc_sleep.cpp"
