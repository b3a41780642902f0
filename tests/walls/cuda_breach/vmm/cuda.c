/* SPDX-License-Identifier: Apache-2.0 */
/* cuda.c: the control of wall_cuda_h_only_in_cuda_c (tests/walls/check_cuda_h.cmake): the one
 * file this tree allows to include cuda.h, which the scan must not name. Never compiled. */
#include <cuda.h>
