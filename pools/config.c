/* SPDX-License-Identifier: Apache-2.0 */
/* config.c: the configuration an allocator or a host pool starts with: the option text
 * from the API or the environment (policy/env.c), parsed over the defaults
 * (policy/parse.c), with the parser's message turned into the thread's error and its
 * warnings (text PyTorch's parser reads by accident) sent to the log sink; and which
 * option keys PyTorch accepts (expseg_option_pytorch, from policy/options.def). */
#include "error.h"
#include "internal.h"

#include <string.h>

expseg_status _expseg_config_load(const char *config, const char *who,
                                  expseg_config_source_t *src, expseg_config_t *cfg) {
  _expseg_config_source(config, NULL, src);
  /* text given to the call is named by the call; text from the environment by its
   * variable, after the call's name unless that is expseg_create (the usual source) */
  if (config != NULL) src->name = who;
  const char *pre = config == NULL && strcmp(who, "expseg_create") != 0 ? who : "";
  const char *sep = pre[0] != '\0' ? ": " : "";
  expseg_config_t defaults;
  _expseg_config_defaults(&defaults);
  char err[EXPSEG_CONFIG_MSG_MAX], warn[EXPSEG_CONFIG_MSG_MAX];
  if (_expseg_config_parse_warn(src->text, src->name, &defaults, cfg, err, sizeof err, warn,
                                sizeof warn) != EXPSEG_OK)
    return _expseg_error_set(EXPSEG_ERR_CONFIG, "%s%s%s", pre, sep, err);
  if (warn[0] != '\0') _expseg_warn("%s%s%s", pre, sep, warn); /* no lock is held here */
  return EXPSEG_OK;
}

int expseg_option_pytorch(const char *key, size_t len) {
  if (key == NULL) return -1;
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    const expseg_option_info_t *o = &_expseg_options[i];
    if ((strlen(o->key) == len && memcmp(o->key, key, len) == 0) ||
        (o->alias != NULL && strlen(o->alias) == len && memcmp(o->alias, key, len) == 0))
      return o->pytorch ? 1 : 0;
  }
  return -1;
}
