/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_load.c: the control of wall_cuda_h_only_in_cuda_c (tests/walls/check_cuda_h.cmake): a
 * vmm/ file beside cuda.c, whose name starts with "cuda", that includes cuda.h, which the
 * scan must name. Never compiled. */
#include "cuda.h"
