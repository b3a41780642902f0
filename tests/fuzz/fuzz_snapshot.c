/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_snapshot.c: libFuzzer target for the history and the snapshot writer (pools/observe/history.c,
 * pools/observe/snapshot.c, pools/observe/pickle_write.c) and the memory summary. The input is a program:
 * each 4-byte op mallocs (size, stream), frees, record_streams, empties the cache, pushes
 * frames whose strings are raw input bytes (any bytes, invalid UTF-8 included) or pops
 * them, resizes the ring (with or without C stacks), or takes a snapshot. Every snapshot
 * must read back through expseg's own reader (bench/replay/trace_pickle.c) when it is linked, and
 * be a well-formed protocol-4 pickle made only of the viewer's opcodes; the summary's lines
 * must all be framed by '|', 75 characters or more. Never a crash or a leak. */
#include "expseg.h"
#if __has_include("trace.h")
#include "trace.h"
#define HAVE_READER 1
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Walks the opcodes; aborts on any the viewer does not accept or on a malformed stream. */
static void walk(const unsigned char *p, size_t n) {
  if (n < 3 || p[0] != 0x80 || p[1] != 4) abort();
  size_t at = 2;
  for (;;) {
    if (at >= n) abort();
    unsigned char op = p[at++];
    size_t arg = 0;
    switch (op) {
    case '.': if (at != n) abort(); return;
    case '(': case '}': case 'u': case ']': case 'e': case 0x86: case 'N': case 0x88:
    case 0x89: break;
    case 'K': case 0x8c: arg = op == 'K' ? 1 : 1 + (at < n ? p[at] : 0); break;
    case 'M': arg = 2; break;
    case 'J': case 'r': case 'j': arg = 4; break;
    case 'G': arg = 8; break;
    case 0x8a: arg = 1 + (at < n ? p[at] : 0); break;
    case 'X':
      if (at + 4 > n) abort();
      arg = 4 + ((size_t)p[at] | (size_t)p[at + 1] << 8 | (size_t)p[at + 2] << 16 |
                 (size_t)p[at + 3] << 24);
      break;
    default: abort();
    }
    if (arg > n - at) abort();
    at += arg;
  }
}

static void snapshot(expseg_allocator *a) {
  unsigned char *buf = NULL;
  size_t len = 0;
  if (expseg_snapshot(a, &buf, &len) != EXPSEG_OK) return; /* out of host memory */
  walk(buf, len);
#ifdef HAVE_READER
  expseg_trace_set_t s;
  expseg_status st = expseg_trace_read_pickle("fuzz", buf, len, &s);
  if (st == EXPSEG_OK) expseg_trace_set_free(&s);
  else if (st != EXPSEG_ERR_OUT_OF_MEMORY && !strstr(expseg_trace_last_error(), "no device has recorded events")) abort();
#endif
  expseg_snapshot_free(buf);
}

static void summary(expseg_allocator *a) {
  char text[16384];
  size_t need = expseg_memory_summary(a, text, sizeof text, false);
  if (need == 0 || need > sizeof text) abort();
  for (const char *l = text; *l;) {
    const char *nl = strchr(l, '\n');
    /* 77 = 75 + the frame; a value wider than its column widens its line, as in PyTorch */
    if (nl == NULL || nl - l < 77 || l[0] != '|' || nl[-1] != '|') abort();
    l = nl + 1;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  expseg_allocator *a = NULL;
  if (expseg_create("sim:capacity=1G", 0, size > 0 && (data[0] & 1) ? "expandable_segments:False" : "", &a) != EXPSEG_OK)
    abort();
  if (expseg_record_history(a, true, 64) != EXPSEG_OK) abort();
  void *live[32] = {0};
  size_t depth = 0;
  for (size_t i = 1; i + 4 <= size; i += 4) {
    const uint8_t *o = data + i;
    unsigned slot = o[1] & 31;
    switch (o[0] % 9) {
    case 0: case 1: case 2:
      if (live[slot] == NULL)
        (void)expseg_malloc(a, ((size_t)o[2] << (o[3] & 31)) + 1, o[3] >> 6, &live[slot]);
      break;
    case 3:
      if (expseg_free(a, live[slot]) != EXPSEG_OK) abort();
      live[slot] = NULL;
      break;
    case 4: (void)expseg_record_stream(a, live[slot], o[2] & 3); break;
    case 5: if (expseg_empty_cache(a) != EXPSEG_OK) abort(); break;
    case 6: { /* frames from raw bytes: the strings may be anything */
      char f[16], n[16];
      size_t k = (size_t)o[2] % 15, m = (size_t)o[3] % 15;
      for (size_t j = 0; j < k; j++) f[j] = (char)(data[(i + j) % size] | 1);
      for (size_t j = 0; j < m; j++) n[j] = (char)(data[(i * 7 + j) % size] | 1);
      f[k] = n[m] = 0;
      expseg_frame fr = {f, n, (int)o[1] - 100};
      if (expseg_history_push_frames(&fr, 1) == EXPSEG_OK) depth++;
      break;
    }
    case 7:
      expseg_history_pop_frames(o[2] & 3);
      depth = depth > (size_t)(o[2] & 3) ? depth - (o[2] & 3) : 0;
      break;
    default:
      if (o[2] & 1) snapshot(a);
      else if (o[2] & 2) summary(a);
      else if (expseg_record_history_ex(a, true, (size_t)o[3] + 1, o[2] & 4 ? EXPSEG_HISTORY_C_STACKS : 0) != EXPSEG_OK) abort();
      break;
    }
  }
  snapshot(a);
  summary(a);
  expseg_history_pop_frames(depth);
  for (unsigned s = 0; s < 32; s++) (void)expseg_free(a, live[s]);
  expseg_destroy(a);
  return 0;
}
