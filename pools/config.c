/* config.c: the configuration an allocator or a host pool starts with: the option text
 * from the API or the environment (policy/env.c), parsed over the defaults
 * (policy/parse.c), with the parser's message turned into the thread's error. */
#include "error.h"
#include "internal.h"

expseg_status _expseg_config_load(const char *config, const char *who,
                                  expseg_config_source_t *src, expseg_config_t *cfg) {
  _expseg_config_source(config, NULL, src);
  expseg_config_t defaults;
  _expseg_config_defaults(&defaults);
  char err[512];
  if (_expseg_config_parse(src->text, src->name, &defaults, cfg, err, sizeof err) != EXPSEG_OK)
    return _expseg_error_set(EXPSEG_ERR_CONFIG, "%s%s", who, err);
  return EXPSEG_OK;
}
