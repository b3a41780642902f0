/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_config.c: libFuzzer target for the config parser. Arbitrary bytes (cut at the first
 * NUL) are parsed over the defaults; a rejected text must leave the output untouched and write
 * a one-line, NUL-terminated message naming the source, the position and what is accepted; an
 * accepted one must print, parse back to the same configuration, and print identically again
 * (the canonical form is a fixed point); when it warns (an accident of PyTorch's parser), the
 * warning is one line and the clean form it gives parses, without a warning, to the same
 * configuration. The same text is also parsed over a non-default base and with tiny buffers. */
#include "policy.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int same(const expseg_config_t *a, const expseg_config_t *b) {
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help)                        \
  if (memcmp(&a->field, &b->field, sizeof a->field)) return 0;
#include "options.def"
#undef EXPSEG_OPTION
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char text[4096];
  if (size >= sizeof text) size = sizeof text - 1;
  memcpy(text, data, size);
  text[size] = '\0';

  expseg_config_t base, out, back, sentinel;
  _expseg_config_defaults(&base);
  memset(&out, 0x5a, sizeof out);
  sentinel = out;
  char err[EXPSEG_CONFIG_MSG_MAX], warn[EXPSEG_CONFIG_MSG_MAX];
  expseg_status st = _expseg_config_parse_warn(text, "FUZZ_SOURCE", &base, &out, err, sizeof err,
                                               warn, sizeof warn);
  if (st != EXPSEG_OK) {
    if (st != EXPSEG_ERR_CONFIG) abort();
    if (memcmp(&out, &sentinel, sizeof out)) abort();       /* untouched on error */
    if (strncmp(err, "FUZZ_SOURCE: position ", 22)) abort(); /* names the source */
    if (memchr(err, '\n', strlen(err))) abort();             /* one line */
    if (!strstr(err, "accepted")) abort();                   /* says what is accepted */
    if (strlen(err) >= sizeof err - 1) abort();              /* never cut */
    if (warn[0]) abort();
  } else {
    if (warn[0]) {
      const char *w = "FUZZ_SOURCE: accepted as PyTorch's parser reads it; write it as ";
      if (strncmp(warn, w, strlen(w))) abort();
      if (memchr(warn, '\n', strlen(warn))) abort();
      if (strlen(warn) < sizeof warn - 1) { /* not cut: the clean form is complete */
        char clean[EXPSEG_CONFIG_MSG_MAX], w2[EXPSEG_CONFIG_MSG_MAX];
        const char *from = warn + strlen(w), *to = strstr(from, " (position ");
        if (!to) abort();
        memcpy(clean, from, (size_t)(to - from));
        clean[to - from] = '\0';
        if (strcmp(clean, "\"\"") == 0) clean[0] = '\0'; /* nothing to write */
        expseg_config_t again;
        if (_expseg_config_parse_warn(clean, "clean", &base, &again, err, sizeof err, w2,
                                      sizeof w2) != EXPSEG_OK)
          abort();
        if (w2[0] || !same(&out, &again)) abort();
      }
    }
    char p1[4096], p2[4096];
    size_t n1 = _expseg_config_print(&out, p1, sizeof p1);
    if (n1 >= sizeof p1) abort();
    if (_expseg_config_parse(p1, "printed", NULL, &back, err, sizeof err) != EXPSEG_OK) abort();
    if (!same(&out, &back)) abort();
    size_t n2 = _expseg_config_print(&back, p2, sizeof p2);
    if (n1 != n2 || memcmp(p1, p2, n1)) abort();
    char ne[EXPSEG_CONFIG_MSG_MAX];
    size_t m = _expseg_config_no_effect(&out, ne, sizeof ne);
    if (m >= sizeof ne || strlen(ne) != m) abort();
  }

  /* over a different base: the same verdict; keys not given keep the base's values */
  expseg_config_t base2 = base;
  base2.expandable_segments = 0;
  base2.max_split_size = (size_t)64 << 20;
  base2.garbage_collection_threshold = 0.25;
  expseg_config_t out2;
  expseg_status st2 = _expseg_config_parse(text, "FUZZ_SOURCE", &base2, &out2, err, sizeof err);
  if (st2 != st) abort();
  if (st2 == EXPSEG_OK) {
    if (out2.given != out.given) abort();
    if (!(out.given & ((uint64_t)1 << EXPSEG_OPT_expandable_segments)) && out2.expandable_segments)
      abort();
  }

  /* tiny and missing error and warning buffers */
  char tiny[3], tw[5];
  if (_expseg_config_parse_warn(text, "FUZZ_SOURCE", &base, &out2, tiny, sizeof tiny, tw,
                                sizeof tw) != st)
    abort();
  if (st != EXPSEG_OK && strlen(tiny) > 2) abort();
  if (strlen(tw) > 4) abort();
  if (_expseg_config_parse(text, NULL, NULL, &out2, NULL, 0) != st) abort();
  return 0;
}
