/* SPDX-License-Identifier: Apache-2.0 */
/* alloc.c: a core file that reaches into the host pool, for wall_pools_folders_control
 * (check_pools_folders.cmake must name this include). Never compiled. */
#include "internal.h"
#include "host/host_pool.h"
