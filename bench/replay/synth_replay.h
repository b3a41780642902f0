/* SPDX-License-Identifier: Apache-2.0 */
/* synth_replay.h: what the replay tool's files share (bench/replay/synth_replay.c: one replay;
 * synth_cli.c: the command line; synth_sweep.c: output and the sweep). Internal to the tools. */
#ifndef EXPSEG_SYNTH_REPLAY_H
#define EXPSEG_SYNTH_REPLAY_H

#include "synth_model.h"
#include "trace.h"
#include "trace_internal.h"

#include <stdint.h>
#include <stdio.h>

#define GIB ((uint64_t)1 << 30)

/* Driver calls that touch memory (expseg.driver.<name>): the cost column of the sweep. */
extern const char *const _expseg_mem_calls[7];
#define N_MEM_CALLS 7
/* ------------------------------------------------------------------------------------ */
/* Options and results                                                                   */

typedef struct opts_s {
  const char *driver;     /* NULL = sim sized from the trace */
  const char *conf;       /* NULL = environment */
  int model;              /* EXPSEG_MODEL_* */
  int device;
  int check, json, sweep, quiet;
  const char *timeline;   /* CSV path or NULL */
  uint64_t timeline_every; /* 0 = auto */
  uint64_t limit;         /* replay only the first `limit` events of each history; 0 = all */
  const char *snapshot;   /* --snapshot OUT.pickle */
  int snapshot_end;       /* --snapshot-at end (else at the peak) */
  int report;             /* --report: memory summary at the peak */
  struct expseg_report_s *html; /* --report FILE.html (bench/replay/report.c), or NULL */
  int allow_oom;          /* a failed request does not make the exit status 1 */
  const char *capacity;   /* --capacity SIZE, or NULL */
  int fit;                /* --fit: the smallest capacity without an OOM, per model */
  expseg_costs_t costs;   /* --costs FILE, else the defaults measured on an H200 */
  const void **warned;    /* the history last warned that its start state cannot be rebuilt
                           * (said once per history, not per row or run); NULL: every time */
} opts_t;

typedef struct result_s {
  uint64_t events;        /* replayed events (p a f r E) */
  uint64_t ops;           /* allocator calls made (malloc, free, empty_cache) */
  uint64_t peak_requested;
  int64_t peak_allocated, peak_reserved, num_device_alloc, num_device_free;
  int64_t warm_alloc, warm_free; /* num_device_alloc/free once the pre-live set is in */
  int64_t warm_calls[N_MEM_CALLS], warm_created, warm_released; /* the same for the calls by kind */
  /* reserved_bytes.{small,large}_pool.{allocated,freed}, at the end and at the window start */
  int64_t pool_bytes[4], warm_pool_bytes[4];
  expseg_calls_t win;     /* the driver calls of the recorded window, priced as driver_ms */
  double driver_ms;
  expseg_calls_t rec;     /* the recorded run's own calls over the window, and their price */
  double rec_ms;
  uint64_t num_ooms;      /* failed mallocs */
  int64_t first_oom;      /* event index of the first failed malloc; -1 none, -2 warm start */
  char first_oom_msg[1024]; /* the allocator's message for it ("" none) */
  uint64_t errors;        /* other failures (first one printed) */
  int64_t created_bytes;  int has_created;
  int64_t released_bytes; /* expseg.released_bytes (0 where absent) */
  int64_t calls[N_MEM_CALLS]; int has_calls;
  uint64_t driver_calls;  /* sum of calls[] */
  double ns_per_op;
  uint64_t loop_ns;
  char driver[128];
  char config[1024];
  int64_t peak_event;     /* event after which reserved memory first reached its peak */
  uint64_t capacity;      /* the device's total memory (expseg_get_info), 0 unknown */
  int model;              /* EXPSEG_MODEL_* */
  int warm_started;       /* the recorded start state was rebuilt */
  expseg_trace_baseline_t base; /* the recorded figures over the replayed window */
} result_t;

/* One replay of t under model with the user's configuration (NULL: the environment for
 * expseg, the recorded setting for pytorch) and capacity (NULL: --capacity / default).
 * 0 ok, 1 check violation or allocator error, 2 allocator not created. */
int _expseg_replay_cap(const expseg_trace_t *t, const opts_t *o, int model,
                       const char *user_conf, const char *capacity, FILE *timeline, FILE *err,
                       result_t *r, const capture_t *cap);
/* synth_fit.c: --fit for one history (every model); 0 ok, 1 no capacity runs, 2 bad input. */
int _expseg_replay_fit(const expseg_trace_t *t, const opts_t *o, FILE *out, FILE *err);
/* Sweep row flags (JSON "flags", in the order of _expseg_flag_names). */
enum { FLAG_EXPSEG_ONLY = 1, FLAG_RECORDED = 2, FLAG_YOURS = 4, FLAG_COLD = 8, FLAG_NEAR = 16,
       FLAG_BEST = 32 };
#define N_FLAGS 6
extern const char *const _expseg_flag_names[N_FLAGS];

/* synth_sweep.c */
void _expseg_json_str(FILE *f, const char *s); /* a JSON string, quoted and escaped */
int _expseg_utf8_len(const unsigned char *s); /* the UTF-8 sequence at s: 1..4 bytes, 0 bad */
const char *_expseg_human(char buf[32], double bytes);
/* The entries of config that differ from expseg's defaults ("expseg's defaults" when none),
 * written into buf (trace_config.c). */
const char *_expseg_config_changed(const char *config, char *buf, size_t len);
double _expseg_ratio(int64_t num, uint64_t den);
void _expseg_replay_json(FILE *f, const expseg_trace_t *t, const result_t *r,
                         const char *label, int rank, const char *section, int flags);
void _expseg_replay_table_head(FILE *f);
void _expseg_replay_table_row(FILE *f, const expseg_trace_t *t, const result_t *r);
int _expseg_replay_sweep(const expseg_trace_t *t, const opts_t *o, FILE *out, FILE *err);

/* report.c: --report FILE.html, one self-contained page per sweep. _new opens the file (NULL
 * after a message on err); the sweep replays each row with _timeline's stream as its
 * --timeline and hands the ranked rows to _row, the same figures as its JSON lines; _write
 * adds the segments at the peak and writes the page (0, or 1 after a message on err). */
typedef struct expseg_report_s expseg_report_t;
expseg_report_t *_expseg_report_new(const char *path, int argc, char **argv, FILE *err);
FILE *_expseg_report_timeline(expseg_report_t *h, const char *label);
void _expseg_report_row(expseg_report_t *h, const result_t *r, const char *label,
                        const char *conf, int rank, const char *section, int flags);
int _expseg_report_write(expseg_report_t *h, const expseg_trace_t *t, const opts_t *o,
                         FILE *err);
void _expseg_report_free(expseg_report_t *h);

#endif
