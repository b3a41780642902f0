/* SPDX-License-Identifier: Apache-2.0 */
/* fidx.c: the free index's slow half (fidx.h has the design and the hit path).
 *
 * Size nodes come from slabs and are never fewer than the block structs ever made (block.c
 * asks _expseg_fidx_reserve before it makes more), and the table is kept at most half full
 * of them: a node is needed only by a free block, so an insert always finds one (spare, or
 * an indexed node left empty, taken back) and never allocates; a free cannot fail. A node
 * whose last block leaves stays indexed (on the empty list), so a size freed and taken
 * again and again costs no treap work; best fit takes back the empty nodes it meets, and a
 * new size takes back an empty node when no spare is left. The heaps are pairing
 * heaps (two-pass merge on a pop): linking a freed block is one comparison, popping the
 * root of a heap that a free just linked is constant time.
 *
 * The block inserted last waits outside the heaps, one per pool (f->last), until the next
 * insert moves it in: best fit compares it with what the heaps give, in the same (size,
 * address) order, so the choice is unchanged. It is what a cache hit most often wants: the
 * block just freed (a repeat of its size takes it back with no heap or table work), or the
 * remainder just split off (the free of the piece merges it back likewise).
 *
 * The index also counts, per pool, the streams that own free blocks in it (lending a
 * tighter fit is asked only when two or more do: policy.h): the pool's home stream by a
 * count beside the pool (one compare on an insert or a remove: all a single-stream program
 * pays), any other in a table of (pool, stream) entries as large as the slots' table and
 * grown with it, so an insert never allocates. */
#include "fidx.h"

#include <stdlib.h>
#include <string.h>

#define NODE_SLAB 512

void _expseg_fidx_init(fidx_t *f) {
  memset(f, 0, sizeof *f);
  f->rng = 0x2545F491u;
  for (int p = 0; p < POOL_COUNT; p++) f->single[p].by_size = true;
}

void _expseg_fidx_destroy(fidx_t *f) {
  for (size_t i = 0; i < f->n_slabs; i++) free(f->slabs[i]);
  free(f->slabs);
  free(f->slots);
  free(f->owners);
  _expseg_fidx_init(f);
}

/* ---- the table: open addressing, linear probing, backward-shift deletion ---- */

static void slot_put(fidx_t *f, szn_t *n) {
  const size_t key = fidx_key(n->size, n->pool);
  size_t i = fidx_slot(f, key, n->stream);
  while (f->slots[i].key != 0) i = (i + 1) & (f->cap - 1);
  f->slots[i] = (fslot_t){.key = key, .stream = n->stream, .node = n};
  f->used++;
}

static void slot_del(fidx_t *f, const szn_t *n) {
  const size_t key = fidx_key(n->size, n->pool);
  size_t i = fidx_slot(f, key, n->stream);
  while (f->slots[i].node != n) {
    expseg_assert(f->slots[i].key != 0);
    i = (i + 1) & (f->cap - 1);
  }
  for (size_t j = i;;) {
    j = (j + 1) & (f->cap - 1);
    if (f->slots[j].key == 0) break;
    size_t home = fidx_slot(f, f->slots[j].key, f->slots[j].stream);
    bool between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (!between) {
      f->slots[i] = f->slots[j];
      i = j;
    }
  }
  f->slots[i] = (fslot_t){0};
  f->used--;
}

void _expseg_fidx_own_add_other(fidx_t *f, int pool, expseg_stream s) {
  fown_t *o = fidx_owner(f, pool, s);
  if (o->blocks > 0) {
    o->blocks++;
    return;
  }
  f->streams[pool]++;
  if (f->home_blocks[pool] == 0) { /* s becomes the home stream: it has no entry */
    f->home[pool] = s;
    f->home_blocks[pool] = 1;
    return;
  }
  *o = (fown_t){.stream = s, .blocks = 1, .pool = pool};
}

/* The owners entry of (pool, s), its count down by one, taken out at 0 (backward-shift
 * deletion). */
void _expseg_fidx_own_sub_other(fidx_t *f, int pool, expseg_stream s) {
  fown_t *o = fidx_owner(f, pool, s);
  expseg_assert(o->blocks > 0);
  if (--o->blocks > 0) return;
  f->streams[pool]--;
  size_t i = (size_t)(o - f->owners);
  for (size_t j = i;;) {
    j = (j + 1) & (f->cap - 1);
    if (f->owners[j].blocks == 0) break;
    size_t home = fidx_slot(f, (size_t)f->owners[j].pool + 1, f->owners[j].stream);
    bool between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (!between) {
      f->owners[i] = f->owners[j];
      i = j;
    }
  }
  f->owners[i] = (fown_t){0};
}

bool _expseg_fidx_reserve(fidx_t *f, size_t blocks) {
  if (f->n_nodes >= blocks) return true;
  size_t cap = f->cap ? f->cap : 64;
  while (cap < 2 * (blocks + NODE_SLAB)) cap *= 2;
  if (cap != f->cap) {
    fslot_t *t = calloc(cap, sizeof *t), *old = f->slots;
    fown_t *o = calloc(cap, sizeof *o), *old_o = f->owners;
    if (t == NULL || o == NULL) {
      free(t);
      free(o);
      return false;
    }
    size_t old_cap = f->cap;
    f->slots = t;
    f->owners = o;
    f->cap = cap;
    f->used = 0;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i].key != 0) slot_put(f, old[i].node);
    for (size_t i = 0; i < old_cap; i++)
      if (old_o[i].blocks != 0) *fidx_owner(f, old_o[i].pool, old_o[i].stream) = old_o[i];
    free(old);
    free(old_o);
  }
  while (f->n_nodes < blocks) {
    if (f->n_slabs == f->cap_slabs) {
      size_t c = f->cap_slabs ? f->cap_slabs * 2 : 16;
      szn_t **s = realloc(f->slabs, c * sizeof *s);
      if (s == NULL) return false;
      f->slabs = s;
      f->cap_slabs = c;
    }
    szn_t *slab = calloc(NODE_SLAB, sizeof *slab);
    if (slab == NULL) return false;
    f->slabs[f->n_slabs++] = slab;
    for (size_t i = 0; i < NODE_SLAB; i++) {
      slab[i].enext = f->spare;
      f->spare = &slab[i];
    }
    f->n_nodes += NODE_SLAB;
  }
  return true;
}

/* ---- the treap of sizes, keyed (stream, size) per pool (base/treap.h) ---- */

typedef struct szkey_s {
  expseg_stream stream;
  size_t size;
} szkey_t;
static inline szkey_t sz_key(const szn_t *n) { return (szkey_t){n->stream, n->size}; }
static inline bool sz_less(szkey_t a, szkey_t b) {
  return a.stream != b.stream ? a.stream < b.stream : a.size < b.size;
}
EXPSEG_TREAP_DEFINE(sztree, szn_t, t, szkey_t, sz_key, sz_less)

/* ---- nodes ---- */

static void empty_unlink(fidx_t *f, szn_t *n) {
  if (n->eprev) n->eprev->enext = n->enext;
  else f->empty = n->enext;
  if (n->enext) n->enext->eprev = n->eprev;
  n->enext = n->eprev = NULL;
}

/* An empty indexed node taken out of the table and its treap, onto the spare list. */
static void reclaim(fidx_t *f, szn_t *n) {
  expseg_assert(n->count == 0 && n->heap == NULL);
  empty_unlink(f, n);
  sztree_remove(&f->root[n->pool], n);
  f->nodes[n->pool]--;
  slot_del(f, n);
  n->enext = f->spare;
  f->spare = n;
}

static szn_t *node_make(fidx_t *f, int pool, expseg_stream s, size_t size) {
  if (f->spare == NULL) { /* the reserve guarantees an empty indexed node then */
    expseg_assert(f->empty != NULL);
    reclaim(f, f->empty);
  }
  szn_t *n = f->spare;
  f->spare = n->enext;
  *n = (szn_t){.size = size, .stream = s, .t.prio = _expseg_treap_prio(&f->rng),
               .pool = (uint8_t)pool};
  sztree_insert(&f->root[pool], n);
  f->nodes[pool]++;
  slot_put(f, n);
  return n;
}

/* ---- the heaps ---- */

/* The two-pass merge of a sibling list (left to right in pairs, then right to left). */
static block_t *merge_pairs(block_t *first) {
  block_t *acc = NULL; /* the merged pairs, a stack through right */
  while (first != NULL) {
    block_t *x = first, *y = x->t.r;
    if (y == NULL) {
      x->hprev = NULL;
      x->t.r = acc;
      acc = x;
      break;
    }
    first = y->t.r;
    x->t.r = y->t.r = NULL;
    block_t *m = fidx_link(x, y);
    m->t.r = acc;
    acc = m;
  }
  if (acc == NULL) return NULL;
  block_t *r = acc;
  acc = acc->t.r;
  r->t.r = NULL;
  while (acc != NULL) {
    block_t *n = acc;
    acc = acc->t.r;
    n->t.r = NULL;
    r = fidx_link(r, n);
  }
  r->hprev = NULL;
  return r;
}

szn_t *_expseg_fidx_node_ready(fidx_t *f, szn_t *n, int pool, expseg_stream s, size_t size) {
  if (n == NULL) return node_make(f, pool, s, size);
  empty_unlink(f, n);
  return n;
}

void _expseg_fidx_cut(szn_t *n, block_t *b) {
  if (n->heap == b) {
    n->heap = merge_pairs(b->t.l);
  } else {
    block_t *p = b->hprev;
    if (p->t.l == b) p->t.l = b->t.r;
    else p->t.r = b->t.r;
    if (b->t.r != NULL) b->t.r->hprev = p;
    block_t *sub = merge_pairs(b->t.l);
    if (sub != NULL) n->heap = fidx_link(n->heap, sub);
  }
}

void _expseg_fidx_emptied(fidx_t *f, szn_t *n) {
  n->eprev = NULL;
  n->enext = f->empty;
  if (f->empty) f->empty->eprev = n;
  f->empty = n;
}

block_t *_expseg_fidx_fit(fidx_t *f, int pool, expseg_stream s, size_t size) {
  for (;;) {
    szn_t *best = sztree_lower_bound(f->root[pool], (szkey_t){s, size});
    if (best == NULL || best->stream != s) return NULL;
    if (best->heap != NULL) return best->heap;
    reclaim(f, best); /* an empty size on the way: taken back, then look again */
  }
}

block_t *_expseg_fidx_fit_from(fidx_t *f, int pool, expseg_stream from, size_t size) {
  for (expseg_stream s = from;;) {
    szn_t *n = sztree_lower_bound(f->root[pool], (szkey_t){s, size});
    if (n == NULL) return NULL;
    if (n->stream != s) { /* a later stream: its sizes of at least `size`, if any */
      s = n->stream;
      if (n->size < size) continue;
    }
    if (n->heap != NULL) return n->heap;
    reclaim(f, n); /* an empty size on the way: taken back, then look again */
  }
}

static size_t tree_largest(const szn_t *n) {
  size_t m = 0;
  for (; n != NULL; n = n->t.l) { /* every node: the right subtrees by recursion */
    if (n->count > 0 && n->size > m) m = n->size;
    size_t r = tree_largest(n->t.r);
    if (r > m) m = r;
  }
  return m;
}

size_t _expseg_fidx_largest(const fidx_t *f) {
  size_t m = 0;
  for (int p = 0; p < POOL_COUNT; p++) {
    size_t x = tree_largest(f->root[p]);
    if (x > m) m = x;
    if (f->last[p] != NULL && f->last[p]->size > m) m = f->last[p]->size;
  }
  return m;
}

/* ---- the check ---- */

#define FAIL(...) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_check: " __VA_ARGS__)

/* One heap: its blocks belong to the node, addresses grow away from the root, the links
 * agree; *count gets the blocks (at most limit: more means a loop). */
/* The walk's stack: one for the whole check, sized for the largest heap (NULL when host
 * memory is short: the heap walks are skipped, not reported as mismatches). */
typedef struct walk_s {
  const block_t **stack;
  uintptr_t *bound;
} walk_t;

static expseg_status heap_check(const szn_t *n, size_t limit, const walk_t *w, size_t *count) {
  *count = 0;
  if (n->heap == NULL) return EXPSEG_OK;
  if (n->heap->hprev != NULL || n->heap->t.r != NULL)
    FAIL("heap root %#lx of size %zu has a parent or a sibling", (unsigned long)n->heap->ptr,
         n->size);
  if (w->stack == NULL) {
    *count = n->count;
    return EXPSEG_OK;
  }
  const block_t **stack = w->stack;
  uintptr_t *bound = w->bound;
  expseg_status st = EXPSEG_OK;
  size_t top = 0;
  stack[top] = n->heap;
  bound[top++] = 0;
  while (top > 0) {
    const block_t *b = stack[--top];
    uintptr_t lo = bound[top];
    if (++*count > limit) {
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: heap of size %zu holds more blocks than its count "
                             "%u (a loop?)", n->size, n->count);
      break;
    }
    if (b->state != BLOCK_FREE || !b->mapped || !b->indexed || b->seg->single ||
        b->size != n->size || b->stream != n->stream || b->seg->pool != n->pool ||
        (b != n->heap && b->ptr <= lo)) {
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: block %#lx (+%zu, state %d) does not belong in the "
                             "heap of size %zu at that place", (unsigned long)b->ptr, b->size,
                             b->state, n->size);
      break;
    }
    if ((b->t.l && b->t.l->hprev != b) || (b->t.r && b->t.r->hprev != b)) {
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: heap links of block %#lx disagree",
                             (unsigned long)b->ptr);
      break;
    }
    if (top + 2 > limit + 1) continue; /* the count test above reports it */
    if (b->t.r) {
      stack[top] = b->t.r;
      bound[top++] = lo;
    }
    if (b->t.l) {
      stack[top] = b->t.l;
      bound[top++] = b->ptr;
    }
  }
  return st;
}

static expseg_status tree_check(const szn_t *n, const szn_t **prev, size_t *count) {
  if (n == NULL) return EXPSEG_OK;
  expseg_status st = tree_check(n->t.l, prev, count);
  if (st != EXPSEG_OK) return st;
  if (*prev != NULL && !sz_less(sz_key(*prev), sz_key(n)))
    FAIL("size treap out of order at size %zu", n->size);
  if ((n->t.l && n->t.l->t.prio > n->t.prio) || (n->t.r && n->t.r->t.prio > n->t.prio))
    FAIL("size treap priorities out of order at size %zu", n->size);
  *prev = n;
  ++*count;
  return tree_check(n->t.r, prev, count);
}

/* Every indexed node: its slot, its key, its heap. */
static expseg_status slots_check(const fidx_t *f, const walk_t *w, size_t *used, size_t *empty,
                                 int64_t total[POOL_COUNT]) {
  expseg_status st;
  for (size_t i = 0; i < f->cap; i++) {
    const fslot_t *sl = &f->slots[i];
    if (sl->key == 0) continue;
    const szn_t *n = sl->node;
    ++*used;
    if (n == NULL || fidx_key(n->size, n->pool) != sl->key || n->stream != sl->stream)
      FAIL("free index table slot %zu does not match its node", i);
    if (fidx_node(f, n->pool, n->stream, n->size) != n)
      FAIL("size node %zu (pool %d) cannot be found by its key", n->size, n->pool);
    size_t c;
    if ((st = heap_check(n, n->count, w, &c)) != EXPSEG_OK) return st;
    if (c != n->count) FAIL("heap of size %zu holds %zu blocks, count %u", n->size, c, n->count);
    *empty += n->count == 0;
    total[n->pool] += n->count;
  }
  return EXPSEG_OK;
}

/* The streams' counts against the nodes and the last inserts: the home stream's count and
 * each entry count their (pool, stream)'s free blocks, each other stream with free blocks
 * has an entry, the home stream none, and the streams per pool add up. */
static expseg_status owners_check(const fidx_t *f) {
  if (f->cap == 0) return EXPSEG_OK;
  size_t *seen = calloc(f->cap, sizeof *seen);
  if (seen == NULL) return EXPSEG_OK; /* no host memory to check with */
  size_t streams[POOL_COUNT] = {0}, home[POOL_COUNT] = {0};
  const char *why = NULL;
  for (size_t i = 0; i < f->cap + POOL_COUNT && why == NULL; i++) { /* nodes, last inserts */
    const szn_t *n = i < f->cap && f->slots[i].key != 0 ? f->slots[i].node : NULL;
    const block_t *l = i >= f->cap ? f->last[i - f->cap] : NULL;
    if ((n == NULL || n->count == 0) && l == NULL) continue;
    const int pool = n != NULL ? n->pool : (int)(i - f->cap);
    const expseg_stream st = n != NULL ? n->stream : l->stream;
    const size_t count = n != NULL ? n->count : 1;
    const fown_t *o = fidx_owner(f, pool, st);
    if (st == f->home[pool]) home[pool] += count;
    else if (o->blocks == 0) why = "a stream with free blocks has no owners entry";
    else seen[o - f->owners] += count;
  }
  for (int p = 0; p < POOL_COUNT && why == NULL; p++) {
    if (home[p] != f->home_blocks[p]) why = "the home stream's count is not its free blocks";
    else if (fidx_owner(f, p, f->home[p])->blocks != 0) why = "the home stream has an entry";
    streams[p] += home[p] > 0;
  }
  for (size_t i = 0; i < f->cap && why == NULL; i++) {
    const fown_t *o = &f->owners[i];
    if (o->blocks == 0) continue;
    if (o->pool < 0 || o->pool >= POOL_COUNT || fidx_owner(f, o->pool, o->stream) != o)
      why = "an owners entry cannot be found by its key";
    else if (seen[i] != o->blocks) why = "an owners entry's count is not its free blocks";
    else streams[o->pool]++;
  }
  for (int p = 0; p < POOL_COUNT && why == NULL; p++)
    if (streams[p] != f->streams[p]) why = "the count of streams with free blocks is wrong";
  free(seen);
  if (why == NULL) return EXPSEG_OK;
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_check: free index: %s", why);
}

expseg_status _expseg_fidx_check(const fidx_t *f, int64_t blocks[POOL_COUNT]) {
  size_t used = 0, empty = 0, most = 0;
  int64_t total[POOL_COUNT] = {0, 0};
  for (size_t i = 0; i < f->cap; i++)
    if (f->slots[i].key != 0 && f->slots[i].node != NULL && f->slots[i].node->count > most)
      most = f->slots[i].node->count;
  walk_t w = {malloc((most + 1) * sizeof *w.stack), malloc((most + 1) * sizeof *w.bound)};
  if (w.stack == NULL || w.bound == NULL) {
    free(w.stack);
    free(w.bound);
    w = (walk_t){NULL, NULL};
  }
  expseg_status st = slots_check(f, &w, &used, &empty, total);
  free(w.stack);
  free(w.bound);
  if (st != EXPSEG_OK) return st;
  if (used != f->used) FAIL("free index table holds %zu nodes, count %zu", used, f->used);
  size_t listed = 0, spare = 0;
  for (const szn_t *n = f->empty; n != NULL && listed <= used; n = n->enext, listed++)
    if (n->count != 0 || n->heap != NULL || fidx_node(f, n->pool, n->stream, n->size) != n)
      FAIL("empty list holds size node %zu, which is not empty and indexed", n->size);
  if (listed != empty) FAIL("%zu empty size nodes, %zu on the empty list", empty, listed);
  for (const szn_t *n = f->spare; n != NULL && spare <= f->n_nodes; n = n->enext) spare++;
  if (spare + used != f->n_nodes)
    FAIL("size nodes: %zu spare + %zu indexed, %zu made", spare, used, f->n_nodes);
  size_t in_trees = 0;
  for (int p = 0; p < POOL_COUNT; p++) {
    const szn_t *prev = NULL;
    size_t c = 0;
    if ((st = tree_check(f->root[p], &prev, &c)) != EXPSEG_OK) return st;
    if (c != f->nodes[p]) FAIL("size treap of pool %d holds %zu, count %zu", p, c, f->nodes[p]);
    if (total[p] != (int64_t)f->blocks[p])
      FAIL("pool %d: heaps hold %lld blocks, count %zu", p, (long long)total[p], f->blocks[p]);
    in_trees += c;
    const block_t *l = f->last[p];
    if (l != NULL && (l->state != BLOCK_FREE || !l->mapped || !l->indexed || l->seg->single ||
                      l->seg->pool != p || l->t.l || l->t.r || l->hprev))
      FAIL("block %#lx, held as pool %d's last insert, is not a free unlinked block of it",
           (unsigned long)l->ptr, p);
    blocks[p] = total[p] + (l != NULL);
  }
  if (in_trees != used) FAIL("size treaps hold %zu nodes, the table %zu", in_trees, used);
  return owners_check(f);
}
