// SPDX-License-Identifier: Apache-2.0
// test_gpu_reliability.cpp: the busy-stream reliability tests of test_alloc_reliability.cpp
// on the cuda backend against the CUDA driver double (label gpu; skips when libcuda.so.1 is
// not the double: the capacities they need are set through it). Streams are created by the
// driver and held with expseg_testing_hold_stream (cuStreamWaitValue32 on a host word).
#define EXPSEG_RELIABILITY_GPU 1
#include "test_alloc_reliability.cpp"
