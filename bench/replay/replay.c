/* SPDX-License-Identifier: Apache-2.0 */
/* replay.c: expseg-replay, which replays recorded or synthetic allocation histories
 * through expseg and reports the memory held. The logic lives in synth_cli.c
 * (expseg_replay_main) so that tests call it in-process; usage in docs/replay.md. */
#include <stdio.h>

#include "tool_version.h"

int expseg_replay_main(int argc, char **argv, FILE *out, FILE *err);

int main(int argc, char **argv) {
  if (expseg_tool_version(argc, argv, "expseg-replay")) return 0;
  return expseg_replay_main(argc, argv, stdout, stderr);
}
