// SPDX-License-Identifier: Apache-2.0
// test_gpu_sleep_cycles.cpp: the tests of test_alloc_sleep_cycles.cpp on the cuda backend
// (label gpu): against the CUDA driver double when libcuda.so.1 is the double, else against
// a real GPU (a test that needs the double skips alone, naming what it needs), else skipped.
#define EXPSEG_SLEEP_GPU 1
#include "test_alloc_sleep_cycles.cpp"
