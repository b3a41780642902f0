/* SPDX-License-Identifier: Apache-2.0 */
/* segcount.c: how many expandable segments each stream holds in each pool, kept as
 * segments come and go, so that a growth asks in O(1) what it used to learn by walking
 * every segment: how many segments its (pool, stream) already reserved (the next
 * reservation's size, policy: _expseg_segment_va). With thousands of streams that walk
 * made each stream's first malloc cost time linear in the streams, filling them
 * quadratic. Per pool, a map from stream key to its segments. When host memory runs out
 * for an entry the counts are dropped for good and the question is answered by walking
 * the segments again: slower, never wrong. expseg_check compares the counts with a walk. */
#include "error.h"
#include "internal.h"

static void lose(expseg_allocator *a) {
  for (int p = 0; p < POOL_COUNT; p++) _expseg_map_free(&a->segcount[p]);
  a->segcount_lost = true;
}

void _expseg_segcount_add(expseg_allocator *a, const segment_t *s, int segs) {
  if (!s->expandable || a->segcount_lost) return;
  _expseg_map_t *m = &a->segcount[s->pool];
  uint64_t *v = _expseg_map_get(m, s->stream), nv = (v ? *v : 0) + (uint64_t)(int64_t)segs;
  if (nv == 0) (void)_expseg_map_take(m, s->stream, NULL); /* never below 0 */
  else if (v) *v = nv;
  else if (!_expseg_map_put(m, s->stream, nv)) lose(a);
}

/* the walk the counts replace (also expseg_check's reference) */
static size_t walk_segments(const expseg_allocator *a, int pool, expseg_stream key) {
  size_t n = 0;
  for (const segment_t *s = a->segments; s; s = s->next_all)
    n += s->expandable && s->pool == pool && s->stream == key;
  return n;
}

size_t _expseg_segcount_of(const expseg_allocator *a, int pool, expseg_stream key) {
  if (a->segcount_lost) return walk_segments(a, pool, key);
  const uint64_t *v = _expseg_map_get(&a->segcount[pool], key);
  return v ? (size_t)*v : 0;
}

/* One walk recounts into fresh maps; every entry must agree, and no other entry exist.
 * true when they agree (or the counts were dropped, or no host memory to recount). */
bool _expseg_segcount_check(const expseg_allocator *a, char *why, size_t len) {
  if (a->segcount_lost) return true;
  _expseg_map_t m[POOL_COUNT];
  bool ok = true, mem = true;
  for (int p = 0; p < POOL_COUNT; p++) _expseg_map_init(&m[p], 0);
  for (const segment_t *s = a->segments; s && mem; s = s->next_all) {
    if (!s->expandable) continue;
    const uint64_t *v = _expseg_map_get(&m[s->pool], s->stream);
    mem = _expseg_map_put(&m[s->pool], s->stream, (v ? *v : 0) + 1);
  }
  for (const segment_t *s = a->segments; s && mem && ok; s = s->next_all) {
    if (!s->expandable) continue;
    const uint64_t *want = _expseg_map_get(&m[s->pool], s->stream),
                   *got = _expseg_map_get(&a->segcount[s->pool], s->stream);
    if (!got || *got != *want) {
      snprintf(why, len, "segment counts of stream %#llx (pool %d): %llu segments; a walk "
               "finds %llu", (unsigned long long)s->stream, s->pool,
               got ? (unsigned long long)*got : 0ull, (unsigned long long)*want);
      ok = false;
    }
  }
  for (int p = 0; p < POOL_COUNT && mem && ok; p++) {
    if (_expseg_map_count(&m[p]) != _expseg_map_count(&a->segcount[p])) {
      snprintf(why, len, "segment counts (pool %d): %zu streams counted, a walk finds %zu", p,
               _expseg_map_count(&a->segcount[p]), _expseg_map_count(&m[p]));
      ok = false;
    }
  }
  for (int p = 0; p < POOL_COUNT; p++) _expseg_map_free(&m[p]);
  return ok;
}

void _expseg_segcount_destroy(expseg_allocator *a) {
  lose(a);
}
