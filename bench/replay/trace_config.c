/* SPDX-License-Identifier: Apache-2.0 */
/* trace_config.c: the part of a configuration string that differs from expseg's defaults,
 * for the replay table's header line (the whole string is over 500 characters: --json
 * carries it). Keys are compared as printed by expseg_config_string, which lists every key
 * once, in a fixed order; a value may hold commas inside brackets ([>:0]), so entries are
 * split at the commas outside them. Also the recorded setting's entries that expseg reads
 * (_expseg_config_known). */
#include "synth_replay.h"
#include "trace_internal.h"

#include <stdio.h>
#include <string.h>

/* The entry of s starting at p: its length up to the next top-level comma. */
static size_t entry_len(const char *p) {
  size_t n = 0;
  int depth = 0;
  for (; p[n] && !(p[n] == ',' && depth == 0); n++) {
    if (p[n] == '[') depth++;
    if (p[n] == ']' && depth > 0) depth--;
  }
  return n;
}

/* Whether the entry (p, n) appears whole in the comma list s. */
static int list_has(const char *s, const char *p, size_t n) {
  while (*s) {
    size_t m = entry_len(s);
    if (m == n && memcmp(s, p, n) == 0) return 1;
    s += m + (s[m] == ',');
  }
  return 0;
}

const char *_expseg_config_changed(const char *config, char *buf, size_t len) {
  static char defaults[1024];
  static int have_defaults;
  if (!have_defaults) {
    expseg_allocator *a = NULL;
    defaults[0] = 0;
    if (expseg_create("sim:capacity=1G", 0, "", &a) == EXPSEG_OK) {
      expseg_config_string(a, defaults, sizeof defaults);
      expseg_destroy(a);
    }
    have_defaults = 1;
  }
  size_t used = 0;
  buf[0] = 0;
  for (const char *p = config; *p;) {
    size_t n = entry_len(p);
    if (n && !list_has(defaults, p, n) && used + n + 2 < len) {
      used += (size_t)snprintf(buf + used, len - used, "%s%.*s", used ? "," : "", (int)n, p);
    }
    p += n + (p[n] == ',');
  }
  if (used == 0) snprintf(buf, len, "expseg's defaults");
  return buf;
}

int _expseg_config_known(const char *s, char *buf, size_t len) {
  size_t used = 0;
  int dropped = 0;
  buf[0] = 0;
  for (const char *p = s; *p;) {
    size_t n = entry_len(p), k = strcspn(p, ":");
    const char *key = p + strspn(p, " ");
    if (k > n) k = n;
    size_t klen = (size_t)(p + k - key);
    while (klen && key[klen - 1] == ' ') klen--;
    if (n && expseg_option_pytorch(key, klen) != -1 && used + n + 2 < len)
      used += (size_t)snprintf(buf + used, len - used, "%s%.*s", used ? "," : "", (int)n, p);
    else if (n)
      dropped++;
    p += n + (p[n] == ',');
  }
  return dropped;
}
