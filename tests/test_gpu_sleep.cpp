// SPDX-License-Identifier: Apache-2.0
// test_gpu_sleep.cpp: the sleep and wake tests of test_alloc_sleep.cpp on the cuda backend
// (label gpu): against the CUDA driver double when libcuda.so.1 is the double, else against
// a real GPU (a test that needs the double skips alone, naming what it needs), else skipped.
// Bytes are checked through cuMemcpyHtoD/DtoH, under fault injection too.
#define EXPSEG_SLEEP_GPU 1
#include "test_alloc_sleep.cpp"
