/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_tool_args.c: libFuzzer target for the tools' command-line parser (bench/tool_args.c):
 * the input's lines are the arguments; any of them is parsed without a crash, and a success
 * leaves every value inside what its option accepts. (--help and -h, which exit, are left
 * out.) */
#include "tool_args.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void no_usage(FILE *f) { (void)f; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  char *text = malloc(size + 1);
  if (text == NULL) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  static char prog[] = "fuzz";
  char *argv[33] = {prog};
  int argc = 1;
  for (char *p = text; argc < 33;) {
    char *nl = strchr(p, '\n');
    if (nl) *nl = '\0';
    if (strcmp(p, "--help") == 0 || strcmp(p, "-h") == 0) goto out;
    argv[argc++] = p;
    if (!nl) break;
    p = nl + 1;
  }
  int flag = 0, choice = -1;
  const char *str = NULL, *strs[3] = {NULL, NULL, NULL};
  uint64_t u = 7, sz = 7, list[4] = {0, 0, 0, 0};
  size_t n_list = 0, n_strs = 0;
  static const char *const choices[] = {"off", "on", "stacks", NULL};
  const _expseg_arg_t t[] = {
      ARG_FLAG_("--flag", &flag),
      ARG_STR_("--str", &str),
      ARG_U64_("--u", &u, 3, 1000),
      ARG_SIZE_("--size", &sz, 1, UINT64_MAX),
      ARG_LIST_("--list", list, 2, 9, &n_list, 4),
      ARG_STRS_("--conf", strs, &n_strs, 3),
      ARG_CHOICE_("--choice", &choice, choices),
  };
  const int rc = _expseg_args_parse("fuzz", argc, argv, t, sizeof t / sizeof t[0], no_usage);
  if (rc != 0 && rc != -1) abort();
  if (u != 7 && (u < 3 || u > 1000)) abort();
  if (sz == 0) abort();
  if (n_list > 4 || n_strs > 3) abort();
  for (size_t i = 0; i < n_list; i++)
    if (list[i] < 2 || list[i] > 9) abort();
  if (choice < -1 || choice > 2) abort();
  if (flag != 0 && flag != 1) abort();
out:
  free(text);
  return 0;
}
