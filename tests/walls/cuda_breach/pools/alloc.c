/* SPDX-License-Identifier: Apache-2.0 */
/* alloc.c: the control of wall_cuda_h_only_in_cuda_c (tests/walls/check_cuda_h.cmake): a file
 * outside the driver layer that includes cuda.h, which the scan must name. Never compiled. */
#include <cuda.h>
