/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_ipc_handle.c: libFuzzer target over the importer (expseg_ipc_import).
 *
 * Input: one selector byte, then the handle's bytes. The selector picks the descriptors
 * that come with them, in this order: bit 0 a 64 MiB sparse memfd (a regular file, as a
 * host arena is), bit 1 a stream socket (what the liveness descriptor is), bit 2 /dev/null
 * (not a chunk), bit 3 a second copy of the memfd. The importer is a host allocator (real
 * mmap), created once. Invariants: import never crashes; failure is
 * EXPSEG_ERR_INVALID_ARGUMENT (or a driver error from the host driver) with a message and
 * leaves no chunk, mapping or reservation behind; success maps memory that can be read and
 * written over the whole announced size and is closed again. */
#include "expseg.h"
#include "expseg_testing.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static expseg_allocator *imp;
static int memfd = -1, sv[2] = {-1, -1}, devnull = -1;

static void setup(void) {
  if (expseg_create("host:capacity=256M", 0, NULL, &imp) != EXPSEG_OK) abort();
  memfd = memfd_create("fuzz-arena", MFD_CLOEXEC);
  if (memfd < 0 || ftruncate(memfd, 64 << 20) != 0) abort();
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
  devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!imp) setup();
  if (size < 1 || size > (1u << 16)) return 0;
  int fds[4];
  size_t n = 0;
  if (data[0] & 1) fds[n++] = memfd;
  if (data[0] & 2) fds[n++] = sv[1];
  if (data[0] & 4) fds[n++] = devnull;
  if (data[0] & 8) fds[n++] = memfd;
  unsigned char *copy = malloc(size);
  if (!copy) return 0;
  memcpy(copy, data + 1, size - 1);
  expseg_ipc_handle h = {copy, size - 1, n ? fds : NULL, n};
  void *p = NULL;
  expseg_status st = expseg_ipc_import(imp, &h, &p);
  if (st == EXPSEG_OK) {
    if (!p) abort();
    uint64_t announced = 0;
    for (int i = 0; i < 8; i++) announced |= (uint64_t)copy[40 + i] << (8 * i);
    volatile unsigned char *b = p;
    b[0] = b[0];
    b[announced - 1] = b[announced - 1];
    if (expseg_ipc_close(imp, p) != EXPSEG_OK) abort();
  } else if (expseg_last_error()[0] == '\0' || p != NULL) {
    abort();
  }
  expseg_testing_driver_counts c;
  if (expseg_testing_driver_counts_get(imp, &c) != EXPSEG_OK || c.live_chunks != 0 ||
      c.mapped_bytes != 0 || c.live_reservations != 0)
    abort();
  free(copy);
  return 0;
}
