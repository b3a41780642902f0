// SPDX-License-Identifier: Apache-2.0
// test_gpu_torch.cpp: the libexpseg_torch.so tests of test_torch.cpp with EXPSEG_DRIVER=cuda,
// against the CUDA driver double (label gpu; configured through $EXPSEG_CUDA_DOUBLE before
// its first use). Needs the double: on a real GPU the capacities the tests assume differ.
#define EXPSEG_TORCH_GPU 1
#include "test_torch.cpp"
