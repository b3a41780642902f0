/* SPDX-License-Identifier: Apache-2.0 */
/* tool_version.h: `--version` for every tool of bench/, one line at the top of each main:
 *   if (expseg_tool_version(argc, argv, "expseg-replay")) return 0;
 * It prints "NAME (expseg) BUILD_VERSION" (the build's git describe version, cmake/version.cmake),
 * then the library the tool runs with (expseg_version()) when it differs, and tells main to
 * stop when any argument is --version. */
#ifndef EXPSEG_TOOL_VERSION_H
#define EXPSEG_TOOL_VERSION_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "expseg.h"
#include "expseg_build_version.h"

static inline bool expseg_tool_version(int argc, char **argv, const char *name) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--version") == 0) {
      printf("%s (expseg) %s\n", name, EXPSEG_BUILD_VERSION);
      if (strncmp(EXPSEG_BUILD_VERSION, expseg_version(), strlen(expseg_version())) != 0)
        printf("library: libexpseg %s\n", expseg_version());
      return true;
    }
  return false;
}

#endif
