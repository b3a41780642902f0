/* SPDX-License-Identifier: Apache-2.0 */
/* expseg_torch_internal.h: what the files of libexpseg_torch.so share and do not export
 * (expseg_torch.c keeps the messages, expseg_torch_host.c the pinned host pool). */
#ifndef EXPSEG_TORCH_INTERNAL_H
#define EXPSEG_TORCH_INTERNAL_H

#include "expseg.h"

/* Keeps msg as the device's last failure (-1: failures that name no device) and prints it,
 * as every failure of the plug. */
void _expseg_torch_fail_msg(int device, const char *msg);
/* The process's pinned host pool, or NULL before the first expseg_torch_host_alloc. */
expseg_host_pool *_expseg_torch_host_existing(void);

#endif
