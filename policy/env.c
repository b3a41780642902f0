/* SPDX-License-Identifier: Apache-2.0 */
/* env.c: where the configuration text comes from. The only file of expseg that reads the
 * environment, and only through the getenv_fn it is given (NULL = getenv), so tests pass a
 * fake environment. Precedence: text passed to the API, else EXPSEG_ALLOC_CONF, else
 * PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF. Values are never merged: one source is
 * used and the other variables that are set are named in `ignored` so the caller can warn
 * once. A variable set to the empty string counts as set, as in PyTorch main (std::optional
 * from c10::utils::get_env has a value): it means "all defaults" and the later variables are
 * not read. */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

static const char *const vars[] = {"EXPSEG_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                                   "PYTORCH_ALLOC_CONF"};

static const char *real_getenv(const char *name) { return getenv(name); }

void _expseg_config_source(const char *api_text, const char *(*getenv_fn)(const char *),
                           expseg_config_source_t *out) {
  if (!getenv_fn) getenv_fn = real_getenv;
  out->text = NULL;
  out->name = "defaults";
  out->ignored[0] = '\0';
  if (api_text) {
    out->text = api_text;
    out->name = "expseg_create";
  }
  size_t used = 0;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv_fn(vars[i]);
    if (!v) continue;
    if (!out->text) {
      out->text = v;
      out->name = vars[i];
      continue;
    }
    size_t n = strlen(vars[i]);
    if (used + (used ? 2 : 0) + n + 1 > sizeof out->ignored) continue; /* cannot happen */
    if (used) {
      memcpy(out->ignored + used, ", ", 2);
      used += 2;
    }
    memcpy(out->ignored + used, vars[i], n + 1);
    used += n;
  }
}
