/* SPDX-License-Identifier: Apache-2.0 */
/* ipc_socket.c: moving a handle (bytes and file descriptors) over a Unix socket.
 *
 * No pidfd_getfd, no ptrace, no /proc/PID/fd: descriptors travel with SCM_RIGHTS, which
 * needs only a connected AF_UNIX socket, so it works in containers and under Yama ptrace
 * restrictions (PyTorch issue #165685). Stream sockets only (SOCK_STREAM): message
 * boundaries are ours. On the wire, in this order:
 *   preamble  16 bytes: magic "EXSK" (4 bytes), version u32 = 1, data size u32, fd count u32
 *             (little-endian);
 *   data      the handle's bytes;
 *   batches   ceil(n_fds / 250) messages of one byte 'F' each carrying up to 250
 *             descriptors in one SCM_RIGHTS control message (the kernel's limit is 253).
 * Received descriptors are close-on-exec (MSG_CMSG_CLOEXEC). A short read, an EOF, a wrong
 * preamble or a truncated control message fails with everything received closed. */
#include "vmm_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

enum { BATCH = 250, PREAMBLE = 16, VERSION = 1 };
#define MAX_DATA (64u << 20)
#define MAX_FDS 65536u

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static expseg_status sys(const char *call, const char *what, int err) {
  return _expseg_error_set(err == ENOMEM ? EXPSEG_ERR_OUT_OF_MEMORY : EXPSEG_ERR_DRIVER,
                           "%s: %s failed: %s", call, what, strerror(err));
}

static expseg_status check_socket(int sock, const char *call) {
  int type = 0;
  socklen_t len = sizeof type;
  if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &len) != 0)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s(fd %d): not a socket: %s", call,
                             sock, strerror(errno));
  if (type != SOCK_STREAM)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s(fd %d): socket type %d: expected a connected AF_UNIX "
                             "SOCK_STREAM socket (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))",
                             call, sock, type);
  return EXPSEG_OK;
}

static expseg_status write_all(int sock, const void *buf, size_t n) {
  const unsigned char *p = buf;
  while (n > 0) {
    ssize_t k = send(sock, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return sys("expseg_ipc_send", "send", k < 0 ? errno : EPIPE);
    p += k;
    n -= (size_t)k;
  }
  return EXPSEG_OK;
}

static expseg_status read_all(int sock, void *buf, size_t n, const char *what) {
  unsigned char *p = buf;
  size_t want = n;
  while (n > 0) {
    ssize_t k = recv(sock, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return sys("expseg_ipc_recv", "recv", errno);
    if (k == 0)
      return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                               "expseg_ipc_recv: the peer closed the socket after %zu of the "
                               "%zu bytes of the %s",
                               want - n, want, what);
    p += k;
    n -= (size_t)k;
  }
  return EXPSEG_OK;
}

expseg_status _expseg_ipc_sock_send(int sock, const void *data, size_t size, const int *fds,
                                    size_t n_fds) {
  expseg_status st = check_socket(sock, "expseg_ipc_send");
  if (st) return st;
  if (size > MAX_DATA || n_fds > MAX_FDS)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_send: %zu bytes and %zu descriptors: at most %u bytes "
                             "and %u descriptors",
                             size, n_fds, MAX_DATA, MAX_FDS);
  unsigned char pre[PREAMBLE];
  memcpy(pre, "EXSK", 4);
  put32(pre + 4, VERSION);
  put32(pre + 8, (uint32_t)size);
  put32(pre + 12, (uint32_t)n_fds);
  if ((st = write_all(sock, pre, sizeof pre)) || (st = write_all(sock, data, size))) return st;
  for (size_t i = 0; i < n_fds; i += BATCH) {
    size_t k = n_fds - i < BATCH ? n_fds - i : BATCH;
    union {
      char buf[CMSG_SPACE(BATCH * sizeof(int))];
      struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    char byte = 'F';
    struct iovec iov = {&byte, 1};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = CMSG_SPACE(k * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(k * sizeof(int));
    memcpy(CMSG_DATA(c), fds + i, k * sizeof(int));
    ssize_t r;
    do r = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    if (r != 1) return sys("expseg_ipc_send", "sendmsg(SCM_RIGHTS)", r < 0 ? errno : EPIPE);
  }
  return EXPSEG_OK;
}

static void close_all(int *fds, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
}

expseg_status _expseg_ipc_sock_recv(int sock, unsigned char **data, size_t *size, int **fds,
                                    size_t *n_fds) {
  *data = NULL, *size = 0, *fds = NULL, *n_fds = 0;
  expseg_status st = check_socket(sock, "expseg_ipc_recv");
  if (st) return st;
  unsigned char pre[PREAMBLE];
  if ((st = read_all(sock, pre, sizeof pre, "preamble"))) return st;
  uint32_t ver = get32(pre + 4), n = get32(pre + 8), nf = get32(pre + 12);
  if (memcmp(pre, "EXSK", 4) != 0 || ver != VERSION)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_recv: not an expseg handle stream (magic or version "
                             "%u; expected \"EXSK\" version %d)",
                             ver, VERSION);
  if (n > MAX_DATA || nf > MAX_FDS)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_recv: %u bytes and %u descriptors announced: at most "
                             "%u and %u",
                             n, nf, MAX_DATA, MAX_FDS);
  unsigned char *d = malloc(n ? n : 1);
  int *f = malloc((nf ? nf : 1) * sizeof *f);
  if (!d || !f) {
    free(d), free(f);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_ipc_recv: out of host memory");
  }
  size_t got = 0;
  st = read_all(sock, d, n, "handle");
  while (st == EXPSEG_OK && got < nf) {
    size_t k = nf - got < BATCH ? nf - got : BATCH;
    union {
      char buf[CMSG_SPACE(BATCH * sizeof(int))];
      struct cmsghdr align;
    } u;
    char byte = 0;
    struct iovec iov = {&byte, 1};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = sizeof u.buf;
    ssize_t r;
    do r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r < 0) {
      st = sys("expseg_ipc_recv", "recvmsg", errno);
      break;
    }
    size_t here = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      int tmp[BATCH + 3];
      if (cnt > BATCH + 3) cnt = BATCH + 3;
      memcpy(tmp, CMSG_DATA(c), cnt * sizeof(int));
      for (size_t i = 0; i < cnt; i++) {
        if (got + here < nf) f[got + here] = tmp[i], here++;
        else close(tmp[i]); /* more than announced */
      }
    }
    got += here;
    if (r == 0 || byte != 'F' || (m.msg_flags & MSG_CTRUNC) || here != k) {
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_ipc_recv: descriptor batch broken (%zu of %zu descriptors "
                             "received%s%s)",
                             got, (size_t)nf, r == 0 ? ", peer closed" : "",
                             (m.msg_flags & MSG_CTRUNC) ? ", control message truncated: "
                                                          "RLIMIT_NOFILE?" : "");
      break;
    }
  }
  if (st != EXPSEG_OK) {
    close_all(f, got);
    free(d), free(f);
    return st;
  }
  *data = d, *size = n, *fds = f, *n_fds = nf;
  return EXPSEG_OK;
}
