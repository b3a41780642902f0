/* SPDX-License-Identifier: Apache-2.0 */
/* synth_fit.c: --fit, per model the smallest device capacity (to 2 MiB) on which a history
 * runs without an OOM: the unconstrained peak reserved first, then that plus 2, 4, 8 ... MiB
 * until it runs, then bisection down towards the peak requested. Usage and fields:
 * docs/replay.md. */
#include "synth_replay.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int fits(const expseg_trace_t *t, const opts_t *o, int model, uint64_t cap,
                FILE *err, result_t *r) {
  char c[32];
  snprintf(c, sizeof c, "%" PRIu64 "K", (cap + 1023) / 1024);
  int rc = _expseg_replay_cap(t, o, model, o->conf, c, NULL, err, r, NULL);
  return rc == 2 ? -2 : (rc == 0 && r->num_ooms == 0);
}

int _expseg_replay_fit(const expseg_trace_t *t, const opts_t *o, FILE *out, FILE *err) {
  opts_t q = *o;
  q.quiet = 1;
  const uint64_t gran = UINT64_C(2) << 20;
  for (int model = EXPSEG_MODEL_EXPSEG; model <= EXPSEG_MODEL_PYTORCH; model++) {
    result_t r;
    int rc = _expseg_replay_cap(t, &q, model, o->conf, NULL, NULL, err, &r, NULL);
    if (rc) return rc;
    char config[sizeof r.config];
    memcpy(config, r.config, sizeof config);
    uint64_t lo = r.peak_requested, hi = ((uint64_t)r.peak_reserved + gran - 1) / gran * gran;
    if (hi < gran) hi = gran; /* a history that holds nothing still needs a device */
    unsigned runs = 1;
    int ok = 0;
    const uint64_t peak = hi;
    for (uint64_t step = gran; (ok = fits(t, &q, model, hi, err, &r)) == 0 && step <= peak * 256;
         step *= 2, runs++)
      hi = peak + step;
    if (ok < 0) return 2;
    if (!ok) {
      fprintf(err, "expseg-replay: %s: --fit: no capacity up to %" PRIu64 " bytes runs "
                   "without an OOM under --model %s\n",
              t->name, hi, _expseg_model_name(model));
      return 1;
    }
    if (hi > peak) lo = hi - (hi - peak) / 2; /* the step before ran out */
    while (hi - lo > gran) {
      uint64_t mid = lo + (hi - lo) / 2;
      int f = fits(t, &q, model, mid, err, &r);
      runs++;
      if (f < 0) return 2;
      if (f) hi = mid;
      else lo = mid;
    }
    char b[32];
    if (o->json) {
      fprintf(out, "{\"trace\":");
      _expseg_json_str(out, t->name);
      fprintf(out, ",\"device\":%d,\"model\":\"%s\",\"config\":", t->device,
              _expseg_model_name(model));
      _expseg_json_str(out, config);
      fprintf(out, ",\"fit_capacity\":%" PRIu64 ",\"fit_runs\":%u}\n", hi, runs);
    } else
      fprintf(out, "%s: runs without an OOM on %s of device memory (%" PRIu64
                   " bytes, to 2 MiB) under --model %s\n", t->name, _expseg_human(b, (double)hi),
              hi, _expseg_model_name(model));
  }
  return 0;
}
