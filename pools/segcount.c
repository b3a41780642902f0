/* segcount.c: how many expandable segments each stream holds, and how many of them map
 * memory, kept as segments come, go, map and unmap, so that a growth asks in O(1) what it
 * used to learn by walking every segment: how many segments its (pool, stream) already
 * reserved (the next reservation's size, policy: _expseg_segment_va) and whether another
 * stream maps memory in its pool (pages then come one per chunk). With thousands of streams
 * those walks made each stream's first malloc cost time linear in the streams, filling
 * them quadratic. Per pool, a map from stream key to (segments | mapping segments << 32)
 * and one from pool tag to mapping segments. When host memory runs out for an entry the
 * counts are dropped for good and the questions are answered by walking the segments again:
 * slower, never wrong. expseg_check compares the counts with a walk. */
#include "error.h"
#include "internal.h"

static void lose(expseg_allocator *a) {
  for (int p = 0; p < POOL_COUNT; p++) {
    _expseg_map_free(&a->segcount[p]);
    _expseg_map_free(&a->segcount_tag[p]);
  }
  a->segcount_lost = true;
}

/* adds d to the 32-bit field at `shift` of key's value; entries that reach 0 go */
static void bump(expseg_allocator *a, _expseg_map_t *m, uint64_t key, int d, unsigned shift) {
  if (a->segcount_lost) return;
  uint64_t *v = _expseg_map_get(m, key), nv = v ? *v : 0;
  nv += (uint64_t)(int64_t)d << shift; /* the fields never go below 0 */
  if (nv == 0) {
    (void)_expseg_map_take(m, key, NULL);
  } else if (v) {
    *v = nv;
  } else if (!_expseg_map_put(m, key, nv)) {
    lose(a);
  }
}

void _expseg_segcount_add(expseg_allocator *a, const segment_t *s, int segs, int mapping) {
  if (!s->expandable) return;
  if (segs) bump(a, &a->segcount[s->pool], s->stream, segs, 0);
  if (mapping) {
    bump(a, &a->segcount[s->pool], s->stream, mapping, 32);
    bump(a, &a->segcount_tag[s->pool], seg_tag(s), mapping, 0);
  }
}

void _expseg_segcount_mapped(expseg_allocator *a, const segment_t *s, size_t before) {
  const bool was = before > 0, is = s->mapped_bytes > 0;
  if (was != is) _expseg_segcount_add(a, s, 0, is ? 1 : -1);
}

/* the walks the counts replace (also expseg_check's reference) */
static size_t walk_segments(const expseg_allocator *a, int pool, expseg_stream key,
                            bool mapping) {
  size_t n = 0;
  for (const segment_t *s = a->segments; s; s = s->next_all)
    n += s->expandable && s->pool == pool && s->stream == key && (!mapping || s->mapped_bytes);
  return n;
}

static size_t walk_tag(const expseg_allocator *a, int pool, uint32_t tag) {
  size_t n = 0;
  for (const segment_t *s = a->segments; s; s = s->next_all)
    n += s->expandable && s->pool == pool && seg_tag(s) == tag && s->mapped_bytes > 0;
  return n;
}

size_t _expseg_segcount_of(const expseg_allocator *a, int pool, expseg_stream key) {
  if (a->segcount_lost) return walk_segments(a, pool, key, false);
  const uint64_t *v = _expseg_map_get(&a->segcount[pool], key);
  return v ? (size_t)(*v & UINT32_MAX) : 0;
}

bool _expseg_segcount_shared(const expseg_allocator *a, int pool, expseg_stream key) {
  if (a->segcount_lost) return walk_tag(a, pool, skey_tag(key)) > walk_segments(a, pool, key, true);
  const uint64_t *t = _expseg_map_get(&a->segcount_tag[pool], skey_tag(key));
  const uint64_t *v = _expseg_map_get(&a->segcount[pool], key);
  return (t ? *t : 0) > (v ? *v >> 32 : 0);
}

/* One walk recounts into fresh maps; every entry must agree, and no other entry exist.
 * true when they agree (or the counts were dropped, or no host memory to recount). */
bool _expseg_segcount_check(const expseg_allocator *a, char *why, size_t len) {
  if (a->segcount_lost) return true;
  _expseg_map_t m[POOL_COUNT], t[POOL_COUNT];
  bool ok = true, mem = true;
  for (int p = 0; p < POOL_COUNT; p++) _expseg_map_init(&m[p], 0), _expseg_map_init(&t[p], 0);
  for (const segment_t *s = a->segments; s && mem; s = s->next_all) {
    if (!s->expandable) continue;
    const uint64_t add = 1 + ((uint64_t)(s->mapped_bytes > 0) << 32);
    const uint64_t *v = _expseg_map_get(&m[s->pool], s->stream);
    mem = _expseg_map_put(&m[s->pool], s->stream, (v ? *v : 0) + add);
    if (mem && s->mapped_bytes > 0) {
      const uint64_t *w = _expseg_map_get(&t[s->pool], seg_tag(s));
      mem = _expseg_map_put(&t[s->pool], seg_tag(s), (w ? *w : 0) + 1);
    }
  }
  for (const segment_t *s = a->segments; s && mem && ok; s = s->next_all) {
    if (!s->expandable) continue;
    const uint64_t *want = _expseg_map_get(&m[s->pool], s->stream),
                   *got = _expseg_map_get(&a->segcount[s->pool], s->stream);
    const uint64_t *want_t = _expseg_map_get(&t[s->pool], seg_tag(s)),
                   *got_t = _expseg_map_get(&a->segcount_tag[s->pool], seg_tag(s));
    if (!got || *got != *want || (want_t ? *want_t : 0) != (got_t ? *got_t : 0)) {
      snprintf(why, len, "segment counts of stream %#llx (pool %d): %llu segments, %llu "
               "mapping, %llu mapping in its pool; a walk finds %llu, %llu, %llu",
               (unsigned long long)s->stream, s->pool,
               got ? (unsigned long long)(*got & UINT32_MAX) : 0ull,
               got ? (unsigned long long)(*got >> 32) : 0ull,
               got_t ? (unsigned long long)*got_t : 0ull,
               (unsigned long long)(*want & UINT32_MAX), (unsigned long long)(*want >> 32),
               want_t ? (unsigned long long)*want_t : 0ull);
      ok = false;
    }
  }
  for (int p = 0; p < POOL_COUNT && mem && ok; p++) {
    if (_expseg_map_count(&m[p]) != _expseg_map_count(&a->segcount[p]) ||
        _expseg_map_count(&t[p]) != _expseg_map_count(&a->segcount_tag[p])) {
      snprintf(why, len, "segment counts (pool %d): %zu streams and %zu pool tags counted, a "
               "walk finds %zu and %zu", p, _expseg_map_count(&a->segcount[p]),
               _expseg_map_count(&a->segcount_tag[p]), _expseg_map_count(&m[p]),
               _expseg_map_count(&t[p]));
      ok = false;
    }
  }
  for (int p = 0; p < POOL_COUNT; p++) _expseg_map_free(&m[p]), _expseg_map_free(&t[p]);
  return ok;
}

void _expseg_segcount_destroy(expseg_allocator *a) {
  lose(a);
}
