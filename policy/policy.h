/* SPDX-License-Identifier: Apache-2.0 */
/* policy.h: configuration and decisions, as pure functions. Nothing here calls the driver,
 * takes a lock, reads a clock or (outside env.c) the environment, or allocates: time, ages
 * and sizes are passed in. pools/ asks; policy/ answers. */
#ifndef EXPSEG_POLICY_H
#define EXPSEG_POLICY_H

#include "expseg.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EXPSEG_MIN_BLOCK ((size_t)512)
#define EXPSEG_SMALL_SIZE ((size_t)1 << 20)     /* <= goes to the small pool */
#define EXPSEG_SMALL_BUFFER ((size_t)2 << 20)   /* classic small segment */
#define EXPSEG_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define EXPSEG_ROUND_LARGE ((size_t)2 << 20)
#define EXPSEG_ROUNDUP_INTERVALS 16
#define EXPSEG_MAX_REQUEST ((size_t)1 << 60)     /* PyTorch's one-exabyte guard: sizes >=
                                                    this are refused as out of memory */
#define EXPSEG_RESERVE_CLASSES_MAX 256           /* bytes kept of a class list */
/* Size of every buffer a config message (error or warning) passes through, from the parser to
 * expseg_last_error() (vmm/error.c keeps 1024 bytes): the parser's messages fit in it. */
#define EXPSEG_CONFIG_MSG_MAX 1024

typedef enum expseg_option_id {
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help) EXPSEG_OPT_##key,
#include "options.def"
#undef EXPSEG_OPTION
  EXPSEG_OPT_COUNT
} expseg_option_id;

typedef struct expseg_config_s {
  int backend;                          /* 0 = native */
  size_t max_split_size;                /* bytes; SIZE_MAX = unlimited */
  size_t max_non_split_rounding;        /* bytes */
  double garbage_collection_threshold;  /* 0 = off */
  uint64_t roundup_power2_divisions[EXPSEG_ROUNDUP_INTERVALS]; /* 0 = off per interval */
  bool expandable_segments;
  size_t large_segment_size;            /* bytes */
  bool release_lock_on_cudamalloc;
  bool pinned_use_cuda_host_register;
  uint32_t pinned_num_register_threads;
  bool pinned_use_background_threads;
  size_t pinned_reserve_segment_size;   /* bytes; 0 = off */
  size_t pinned_max_round_threshold;   /* bytes; SIZE_MAX = off */
  size_t pinned_max_cached_size;       /* bytes; SIZE_MAX = off */
  bool pinned_carve_strict;
  bool pinned_huge_pages;
  bool graph_capture_record_stream_reuse;
  double per_process_memory_fraction;
  bool throw_on_cudamalloc_oom;
  bool pinned_free_catch_all;
  double expandable_segments_reserve;   /* 0 = not set; a fraction, or GiB when _gib */
  bool expandable_segments_reserve_gib; /* set with expandable_segments_reserve */
  char expandable_segments_reserve_by_class[EXPSEG_RESERVE_CLASSES_MAX]; /* "a:0.5,b:8G" */
  size_t page_size;                     /* bytes; 0 = granularity */
  size_t page_cache_max;                /* bytes */
  size_t va_reserve;                    /* bytes; 0 = auto */
  size_t single_chunk_min;              /* bytes; SIZE_MAX = off (single_chunk_min_mb) */
  size_t chunk_max;                     /* bytes; SIZE_MAX = off (chunk_max_mb) */
  bool verbose;
  uint64_t given;                       /* bit EXPSEG_OPT_x set = key x was in the text */
} expseg_config_t;

/* ---- parse.c ---- */

void _expseg_config_defaults(expseg_config_t *c);
/* Parses text (NULL or "" = nothing given) into a config starting from *base: keys given
 * replace base's values, others keep them; out->given has exactly the keys in text.
 * On error returns EXPSEG_ERR_CONFIG and writes one line into err (errlen bytes) naming
 * `source` ("expseg_create", "PYTORCH_CUDA_ALLOC_CONF", ...), the byte position, the key,
 * the offending value and what is accepted; *out is then untouched.
 * Pure: no environment, no globals, no allocation. */
expseg_status _expseg_config_parse(const char *text, const char *source,
                                   const expseg_config_t *base, expseg_config_t *out,
                                   char *err, size_t errlen);
/* The same, and on success writes into warn (warnlen bytes; "" when none) one line naming
 * every place where the text relied on an accident of PyTorch's parser (a sign, junk after a
 * number, a separator other than the grammar's, a trailing ',', an empty list, an ignored
 * reserve value...), the value taken for it, and the clean form of the keys given. */
expseg_status _expseg_config_parse_warn(const char *text, const char *source,
                                        const expseg_config_t *base, expseg_config_t *out,
                                        char *err, size_t errlen, char *warn, size_t warnlen);
/* The whole configuration as one option string that parses back to the same config
 * (every key, canonical spelling). Returns the length needed (snprintf semantics). */
size_t _expseg_config_print(const expseg_config_t *c, char *buf, size_t len);
/* Options that are accepted but have no effect here, named in a warning line (or "" if
 * none of them was given). */
size_t _expseg_config_no_effect(const expseg_config_t *c, char *buf, size_t len);

typedef struct expseg_option_info_s {
  const char *key, *alias, *kind, *help;
  bool pytorch;
} expseg_option_info_t;
extern const expseg_option_info_t _expseg_options[EXPSEG_OPT_COUNT];

/* ---- env.c: where the text comes from ---- */

typedef struct expseg_config_source_s {
  const char *text; /* NULL = nothing set anywhere */
  const char *name; /* "expseg_create" / "EXPSEG_ALLOC_CONF" / ... / "defaults" */
  char ignored[160]; /* names of other variables that were set and ignored ("" if none) */
} expseg_config_source_t;
/* api_text wins; else EXPSEG_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF, else
 * PYTORCH_ALLOC_CONF. getenv_fn lets tests pass a fake environment (NULL = getenv). */
void _expseg_config_source(const char *api_text, const char *(*getenv_fn)(const char *),
                           expseg_config_source_t *out);

/* ---- round.c: size policy ---- */

/* Rounded size (512 B steps, or roundup_power2_divisions as PyTorch's round_size does,
 * including its 64-bit wrap of 512 x divisions); 0 when size >= EXPSEG_MAX_REQUEST (PyTorch
 * refuses those before rounding). size 0 -> 512. */
size_t _expseg_round_size(const expseg_config_t *c, size_t size);
static inline bool _expseg_is_small(size_t rounded) { return rounded <= EXPSEG_SMALL_SIZE; }

/* The library's one floor(log2(v)) (v > 0), by count of leading zeros. */
static inline unsigned _expseg_log2_floor(size_t v) {
  return (unsigned)(sizeof(unsigned long long) * 8 - 1) - (unsigned)__builtin_clzll((unsigned long long)v);
}
/* The library's one round-up: v to a multiple of step (step > 0); 0 on overflow. */
static inline size_t _expseg_round_up(size_t v, size_t step) {
  size_t rem = v % step;
  if (rem == 0) return v;
  if (v > SIZE_MAX - (step - rem)) return 0;
  return v + (step - rem);
}
/* Classic segment size: <= 1 MiB -> 2 MiB; < 10 MiB -> large_segment_size; else rounded up
 * to 2 MiB. */
size_t _expseg_classic_segment_size(const expseg_config_t *c, size_t rounded);
/* Split a free block of block_size to serve rounded? expandable = block's segment kind.
 * Inline: every hit that does not take a block of exactly its size asks it. */
static inline bool _expseg_should_split(const expseg_config_t *c, bool small, bool expandable,
                                        size_t block_size, size_t rounded) {
  if (block_size < rounded) return false;
  size_t remaining = block_size - rounded;
  if (small || expandable) return remaining >= EXPSEG_MIN_BLOCK;
  return rounded < c->max_split_size && remaining > EXPSEG_SMALL_SIZE;
}
/* A block or segment of `size` bytes is oversize (>= max_split_size); inline: a hit asks. */
static inline bool _expseg_is_oversize(const expseg_config_t *c, size_t size) {
  return size >= c->max_split_size;
}
/* decide.c: bytes of cached physical pages above page_cache_max (0: within the bound). */
size_t _expseg_page_cache_excess(const expseg_config_t *c, size_t cached_bytes);
/* decide.c: the hint of an out-of-memory message, from what ran out. */
typedef enum {
  EXPSEG_HINT_TOO_LARGE,     /* larger than the whole device */
  EXPSEG_HINT_UNIT_TOO_LARGE, /* the page or classic segment it needs exceeds the device */
  EXPSEG_HINT_ADDRESS_SPACE, /* address space, not memory (expandable: va_reserve_mb) */
  EXPSEG_HINT_ADDRESS_SPACE_CLASSIC, /* address space with classic segments (no reserve)*/
  EXPSEG_HINT_STRANDED,      /* enough held but unallocated, split across classic segments */
  EXPSEG_HINT_FRACTION,      /* the memory fraction caps the allocator */
  EXPSEG_HINT_FULL           /* memory is simply full */
} expseg_oom_hint_t;
typedef struct expseg_oom_facts {
  bool too_large, address_space; /* what the failed request ran into */
  bool expandable;               /* expandable_segments on */
  bool capped;                   /* a memory fraction below 1 limits the allocator */
  size_t held, allocated, rounded;
  size_t unit;                   /* what the request must create: an expandable page, or a
                                  * classic segment (large_segment_size for 1-10 MiB) */
  size_t total;                  /* the device's bytes */
  /* free mapped bytes by how usable they were for the request: in partly used pages (or
   * free blocks of classic segments) of its own place, on other streams' segments, in other
   * pools (the other size pool, other private pools) */
  size_t partial, other_streams, other_pools;
  /* of other_pools, the bytes in private pools still in use (not released, or released
   * with blocks still allocated): neither empty_cache nor the general cache can take them */
  size_t other_pools_live;
  /* whole free pages at the request's place, of them those pinned (in chunks shared with a
   * block in use, so they cannot move), the device's free bytes, and the chunk_max_mb in
   * force (SIZE_MAX: off) */
  size_t whole, pinned, device_free, chunk_max;
} expseg_oom_facts_t;
expseg_oom_hint_t _expseg_oom_hint(const expseg_oom_facts_t *f);
/* decide.c: which other setting or call would have served the request, beside the hint */
typedef enum {
  EXPSEG_HELP_NONE,          /* nothing beyond the hint */
  EXPSEG_HELP_OTHER_POOLS,   /* enough is free in other pools: release them / empty_cache */
  EXPSEG_HELP_LIVE_POOLS,    /* enough only counting private pools still in use: release
                              * those pools or empty each (expseg_pool_empty_cache);
                              * empty_cache cannot give it back */
  EXPSEG_HELP_OTHER_STREAMS, /* enough is free on busy streams: wait for their work */
  EXPSEG_HELP_PAGE_SIZE,     /* enough is free in partly used pages: page_size_mb lower */
  EXPSEG_HELP_CHUNK_MAX      /* pinned whole pages would cover what was missing: a lower
                              * chunk_max_mb (while the one in force allows two pages
                              * or more: `unit` is the page) */
} expseg_oom_help_t;
expseg_oom_help_t _expseg_oom_help(const expseg_oom_facts_t *f);
/* Oversize rules (classic blocks only): may a cached block of candidate bytes serve? */
bool _expseg_oversize_ok(const expseg_config_t *c, size_t rounded, size_t candidate);
/* Expandable page size for a driver granularity: page_size rounded up to g (0 = g). */
size_t _expseg_page_size(const expseg_config_t *c, size_t granularity);
/* Bytes an expandable segment maps for a request that needs `need` more: at least `need`,
 * and at least 1/EXPSEG_GROW_DIVISOR of what the segment already maps, so a growing segment
 * makes fewer, larger maps while holding at most that fraction beyond its peak. */
#ifndef EXPSEG_GROW_DIVISOR
#define EXPSEG_GROW_DIVISOR 128
#endif
/* The large pool's minimum growth: 16 MiB, for a request below a chunk (EXPSEG_CHUNK_MAX,
 * below), mapped only while the memory held after the growth stays within
 * EXPSEG_GROW_MIN_PERMILLE / 1000 (1.02, the bound of growth near the bound, below) of the
 * most bytes allocated at once so far (the request served included; `allocated` below)
 * plus EXPSEG_TIGHT_SLACK: a segment of small requests then grows by 16 MiB at a time, one
 * set_access call and one handle (chunks, below) where it made one per request, as
 * PyTorch's 20 MiB pages serve the next few requests. Weighed against the peak rather than
 * the bytes allocated at the growth, since memory held is weighed against the peak live
 * bytes: a growth within 1.02 x the peak so far cannot take the peak held past 1.02 x the
 * peak live, whatever was freed before it. Not for a request of a chunk or more: it makes
 * few growths anyway, and the surplus would share a chunk with its last page, so the next
 * such request's pages would sit in a chunk the first one pins. (docs/benchmarks.md,
 * "A minimum growth within the bound of the peak": chosen on half A of the recorded
 * histories and synthetic seeds, confirmed on half B and on seeds no choice used.)
 * Overridable at build time, for measuring. */
#ifndef EXPSEG_LARGE_GROW_MIN
#define EXPSEG_LARGE_GROW_MIN ((size_t)16 << 20)
#endif
#ifndef EXPSEG_GROW_MIN_PERMILLE
#define EXPSEG_GROW_MIN_PERMILLE 1020u
#endif
size_t _expseg_grow_bytes(size_t need, size_t segment_mapped);
/* A small-pool segment maps at least EXPSEG_SMALL_GROW_MIN, since its pages hold requests
 * of at most 1 MiB and fill at once, and a larger chunk costs no more calls than a smaller
 * one. */
#ifndef EXPSEG_SMALL_GROW_MIN
#define EXPSEG_SMALL_GROW_MIN ((size_t)4 << 20)
#endif
/* Growth near the bound. The bound: EXPSEG_TIGHT_PERMILLE / 1000 of the most bytes
 * allocated at once so far, the request served included (`allocated`), plus
 * EXPSEG_TIGHT_SLACK. A growth that would
 * map `grow` bytes (its floor and minimum above) maps only the `exact` bytes the request
 * lacks when the bytes held after it (`held` now: every pool and the page cache) would
 * pass the bound: near a peak, the floor's surplus is what is held beyond the live bytes,
 * since the pool's free pieces are too small for the requests that grow; and past the
 * bound already (free memory that blocks in use pin), more surplus only adds to it. Far
 * below the bound the floor stays, and with it few, large growths: each growth is a
 * set_access call, the dearest per call of the VMM calls. (docs/benchmarks.md, "Growth
 * near the bound"; with the minimum above, dropping the floor also past the bound brings
 * silmont2000 nearer its bound: "A minimum growth within half a percent".) Overridable at
 * build time, for measuring. */
#ifndef EXPSEG_TIGHT_PERMILLE
#define EXPSEG_TIGHT_PERMILLE 1020u
#endif
#ifndef EXPSEG_TIGHT_SLACK
#define EXPSEG_TIGHT_SLACK ((size_t)8 << 20)
#endif
bool _expseg_grow_tight(size_t held, size_t allocated, size_t exact, size_t grow);
/* Bytes a growth maps at a place for a request (of `request` bytes, rounded) that lacks
 * `need` bytes there, pages of `page` bytes, in a segment mapping `segment_mapped` of the
 * small pool (small) or the large one; held and allocated as above: the floor, the pool's
 * minimum (the large pool's only within its bound and for a request below a chunk,
 * EXPSEG_CHUNK_MAX), and only `need` near the bound. */
size_t _expseg_grow_for(size_t need, size_t page, size_t segment_mapped, bool small,
                        size_t held, size_t allocated, size_t request);
/* Pages of the next physical chunk a growth creates when `left` pages are still to create:
 * one under PyTorch's model (its ExpandableSegment creates a chunk per page); else what
 * the growth needs, up to EXPSEG_CHUNK_MAX bytes (EXPSEG_REQUEST_CHUNK_MAX for the pages
 * of a request's own, `request`, below): one create and one map per chunk, where a chunk
 * per page costs a create and a map per page; a growth of `want` pages of at most the
 * large pool's minimum growth (16 MiB) is one chunk, its request's own pages apart (below).
 * A chunk is mapped, moved and given back only
 * whole, so larger chunks trade how finely idle memory can move for fewer calls (8 MiB:
 * chosen on half of the recorded histories under the costs measured on an H200, confirmed
 * on the other half; docs/benchmarks.md, "Chunk size under the measured costs");
 * between streams memory is lent rather than moved (reuse before growth, below), so pools
 * that streams share get the same chunks (docs/benchmarks.md, "Placement and chunks"). */
#ifndef EXPSEG_CHUNK_MAX /* -DEXPSEG_CHUNK_MAX=BYTES builds another size, for measuring */
#define EXPSEG_CHUNK_MAX ((size_t)1 << 23)
#endif
size_t _expseg_chunk_pages(bool pytorch, size_t left, size_t page, bool request, size_t want);
/* Chunks that move together are created together. Of the `want` pages a growth creates,
 * the first `request` lie wholly under the request it serves (from the start of the
 * growth to the request's last whole page); the rest are the growth floor's surplus and
 * the page the request shares with what comes after it. Where the growth is larger than
 * one chunk, the request's pages get chunks of their own, of up to EXPSEG_REQUEST_CHUNK_MAX
 * bytes: freed, the request leaves them whole and free, so they move or go back whole,
 * where chunks straddling its end would stay pinned by what was placed after it. A
 * growth of at most one chunk (or of at most the minimum growth, above) stays one chunk
 * (two would cost a second handle for nothing that can move), unless the request (of
 * `bytes`, rounded) or its own pages are at least a chunk (EXPSEG_CHUNK_MAX) and the
 * growth maps more: then its pages are a chunk of their own too, so the minimum never
 * pairs a request of a chunk or more with what comes after it, also where the request
 * starts in memory mapped before and only part of it lies in the growth (a program that
 * frees one of each pair could not get its memory back for anything larger). Returns the
 * pages to create as the request's chunks (0: none).
 * (docs/benchmarks.md, "Chunks of a request's own": 64 MiB chosen on half of the recorded
 * histories and synthetic seeds, confirmed on the other half.) */
#ifndef EXPSEG_REQUEST_CHUNK_MAX
#define EXPSEG_REQUEST_CHUNK_MAX ((size_t)64 << 20)
#endif
size_t _expseg_request_pages(size_t want, size_t request, size_t page, size_t bytes);
/* chunk_max_mb: the pages of a chunk the rules above chose (`pages`), bounded to
 * `chunk_max` bytes in whole pages of `page` bytes, at least one page (SIZE_MAX or a page
 * of 0: `pages` as is). A chunk moves or goes back only whole, so near a device's capacity
 * a smaller chunk leaves fewer free pages pinned by a block in use that shares it. */
size_t _expseg_chunk_limit(size_t pages, size_t chunk_max, size_t page);
/* Reuse before growth. A request maps or creates memory only when no memory already
 * mapped and free can serve it, in this order: a free block of its own stream (best fit);
 * a free block another stream of the same pool holds, once that stream's queued work is
 * done (lent: it goes back to its owner when freed and the borrower's work is done); then
 * growth at a place (an unmapped range with the free blocks around it) of its own stream,
 * or of an idle stream of the same pool when that place needs fewer new pages
 * (_expseg_place_better: have_own whether the stream has a place at all); the pages come
 * from the page cache, then from idle chunks moved from free blocks anywhere (any chunk
 * that fits the place: the rest of a larger one is free memory there, which any stream
 * may borrow), and only then from the driver. */
bool _expseg_place_better(bool have_own, size_t own_pages, size_t other_pages);
/* Moving idle chunks, or creating. Moving an idle chunk (unmap it where it is, map it at
 * the growth) keeps memory held flat, but its free block then has no memory behind it: a
 * program that frees and soon needs the same room again (a torch.cat cache that grows by a
 * token a step, layer after layer) then grows again there and moves another block's
 * chunks, one move per request, where creating once would have ended it. So a growth
 * moves idle chunks only where creating its missing `add` bytes would take the memory held
 * (`held`: mapped, cached and classic) past EXPSEG_MOVE_PERMILLE / 1000 of the most bytes
 * allocated at once so far (`allocated`, the request included) plus EXPSEG_TIGHT_SLACK;
 * within that it creates them. Memory short (the out-of-memory retry), or creating
 * refused by the memory fraction or the device, moves whatever the bound. 1.012: within
 * the memory bound of growth near the bound (1.02, above), with room left below it for
 * memory that blocks in use pin. (docs/benchmarks.md, "Moving idle chunks only near the
 * bound": chosen on half A of the recorded histories and synthetic seeds, confirmed on
 * half B, on seeds no choice used, on generated shapes and on torch.cat generation.)
 * Overridable at build time, for measuring; 0 moves always, as before. */
#ifndef EXPSEG_MOVE_PERMILLE
#define EXPSEG_MOVE_PERMILLE 1012u
#endif
bool _expseg_move_first(size_t held, size_t add, size_t allocated);
/* Of the free block just after a growth's place (its suffix), the lowest bytes a move must
 * leave: none of it may move (SIZE_MAX) unless memory is short or creating was refused
 * (`any`), since moving the suffix's chunks down to the place, growth after growth, costs
 * a move per request where creating costs one growth (a buffer grown by reallocation at a
 * segment's top: 24 -> 101 x PyTorch's modelled driver time on such a shape); where it may,
 * what the request needs of the suffix (`needed` bytes) stays, and its lowest chunk with it,
 * so the place still holds (the idle memory next to the place may be all there is). */
size_t _expseg_suffix_keep(bool any, size_t needed);
/* Which of a stream's own places a growth takes: the lowest address that fits, so the
 * common growth costs one index step; but when memory is short (the out-of-memory retry)
 * every place is weighed (linear in the stream's unmapped ranges, as the rest of that path
 * is): _expseg_place_fewer says whether a place (`missing` of its `pages` not coverable by
 * idle chunks that could move there: those in free blocks elsewhere, of either size pool
 * and of a pool the growth may take from, of the place's page size and no larger than its
 * room, not in the place's own free neighbours) beats the best so far: fewer missing pages (what the device must
 * still have), then fewer pages; ties keep the lower address. */
bool _expseg_place_fewest_pages(bool memory_short);
bool _expseg_place_fewer(size_t missing, size_t pages, size_t best_missing, size_t best_pages);
/* Both searches of other streams' memory look at the EXPSEG_LEND_SCAN oldest idle free
 * blocks of the pool (a place is the unmapped range after one): a request's cost stays
 * bounded however many streams there are; the oldest are the likeliest to be idle. */
#define EXPSEG_LEND_SCAN 64
/* Lending a tighter fit. A request whose own stream's best free block would leave
 * EXPSEG_LEND_WASTE bytes or more of that block unused (own: its size; 0 when none fits)
 * takes instead the smallest free block of at least the request that another idle stream
 * of the same pool holds, when that one is smaller (_expseg_lend_tighter): a piece left
 * between another stream's blocks serves it, and its own larger free block (the end of its
 * segment, often) stays whole for a larger request, which would otherwise grow. Several
 * streams then hold fewer such pieces at a peak (docs/benchmarks.md, "Free pieces of other
 * streams"). 2 MiB: chosen on half of the recorded histories and synthetic seeds,
 * confirmed on the other half. */
#define EXPSEG_LEND_WASTE ((size_t)2 << 20)
/* Asked only where something can be lent: `streams` counts the streams that own free
 * blocks in the request's pool (its own stream among them); with fewer than two (a
 * single-stream program, or no other stream with a free block) no other stream has a block
 * to lend, and the request takes its own best fit on the hit path. */
bool _expseg_lend_look(size_t streams, size_t rounded, size_t own);
/* May another stream's free block of `other` bytes serve a request (at most `other`)
 * whose own stream's best fit has `own` bytes (0: none)? When it is the smaller. */
bool _expseg_lend_tighter(size_t own, size_t other);
/* May a pool take idle pages from the other pool, which last took this pool's pages at
 * tick `robbed` (0 = never; ticks count frees)? Not within EXPSEG_NO_TAKE_BACK ticks: two
 * pools taking turns would otherwise trade the same pages back and forth, a map and an
 * unmap each time; the pool creates its own pages instead, once. */
#define EXPSEG_NO_TAKE_BACK 64
bool _expseg_may_take_back(uint64_t robbed, uint64_t now);
/* Threads that pre-fault the pinned host copy of an offloaded region (sleep): one per
 * EXPSEG_SLEEP_FAULT_SPAN bytes, at most the `cpus` online and EXPSEG_SLEEP_FAULT_MAX,
 * rounded down to a power of two (the driver's rule), at least one. Faulting the pages in
 * is most of a first sleep's time. On an H100 machine (16 CPUs, a virtual machine) a first
 * sleep of 16 GiB took 9.3 s with one thread, 6.4 s with 16 and 4.2 s with 4 (huge pages
 * advised in both); filling 4 GiB, 4 threads beat 1, 2, 8 and 16 (docs/benchmarks.md,
 * "Figures on an H100"; one machine: not confirmed elsewhere). Where the driver makes the
 * host copy itself (cuMemCreate on the device's host NUMA node) the threads are unused. */
#define EXPSEG_SLEEP_FAULT_SPAN ((size_t)256 << 20) /* not tuned: small copies, one thread */
#define EXPSEG_SLEEP_FAULT_MAX 4u
uint32_t _expseg_sleep_fault_threads(size_t bytes, long cpus);
/* Private pools (docs/api.md, "Private pools"): may growth or trimming on behalf of pool
 * `taker` (0: the general cache, and every trimming: garbage collection, empty_cache, the
 * out-of-memory path) move or give back free memory of pool `owner`? Its own, the general
 * cache's, and a released pool's (use count 0) whose blocks are all free (busy 0); never a
 * live private pool's: its memory is its own until it is emptied or released. */
bool _expseg_pool_may_take(uint32_t taker, uint32_t owner, int owner_use_count,
                           size_t owner_busy);
/* The reserve of stream class cls in expandable_segments_reserve_by_class, in bytes of a
 * device of `total` bytes (a fraction of it, or GiB; saturates); false when cls is NULL, ""
 * or not listed. */
bool _expseg_class_reserve(const expseg_config_t *c, const char *cls, size_t total,
                           size_t *bytes);
/* Address space for a new expandable segment of a stream of class cls (NULL: none): the
 * class's reserve when expandable_segments_reserve_by_class lists it (at most 9/8 of total;
 * every segment of the stream alike); else va_reserve_mb, else expandable_segments_reserve
 * when set (a fraction of total or GiB, at most 9/8 of total), else EXPSEG_VA_FIRST, for the
 * first large-pool segment of a stream, doubled for each segment the stream and pool already
 * have (at most 4 times; where the user set the size, not past 9/8 of total). An eighth of
 * that for the small pool (requests of at most 1 MiB), at least 64 pages; never less than
 * `need`. A multiple of page. The default does not depend on the device's size, so the
 * segments a program's requests land in, and the memory it holds, are the same on every
 * device it fits (a device just large enough for the peak included: replay --fit). 8 GiB:
 * 1,000 streams reserve about 9 TiB of a 128 TiB address space (docs/design.md). */
#define EXPSEG_VA_FIRST ((size_t)8 << 30)
size_t _expseg_segment_va(const expseg_config_t *c, bool small, size_t existing, size_t need,
                          size_t total, size_t page, const char *cls);
/* Pinned host pool, exact carved blocks (pools/host/host_carve.c; docs/host_pool.md):
 * the size of a new carve segment for a block of cls bytes when the carve segments held
 * make `held` bytes: 1/32 of held, within [2 MiB, 256 MiB], rounded up to page, never less
 * than cls. */
size_t _expseg_carve_segment_size(size_t held, size_t cls, size_t page);
/* May a request of cls bytes be cut from a free carved block of free_size bytes (>= cls)?
 * whole: the block is a whole carve segment (nothing in it in use); fresh: the segment a
 * miss would make (_expseg_carve_segment_size). Yes, except with pinned_carve_strict for a
 * whole segment larger than fresh: the request then misses, and the miss gives the whole
 * free segments back before it makes the fresh one, so a small block never pins a large
 * free segment. */
bool _expseg_carve_may_take(bool strict, size_t free_size, bool whole, size_t fresh);
/* Allowed bytes for a fraction of total; SIZE_MAX when fraction >= 1. */
size_t _expseg_allowed_bytes(double fraction, size_t total);

/* ---- gc.c: garbage collection and trimming decisions ---- */

typedef struct expseg_gc_item_s {
  size_t bytes;       /* what releasing this item gives back */
  uint64_t idle_since_ns; /* when it became free */
  uintptr_t tag;      /* caller's handle, untouched */
  size_t order;       /* set by _expseg_gc_select: the item's place in the caller's list */
} expseg_gc_item_t;
/* Bytes GC should reclaim: held - threshold x allowed when GC is active (fraction < 1 and
 * threshold > 0) and held exceeds it; else 0. */
size_t _expseg_gc_target(const expseg_config_t *c, size_t held, size_t allowed);
/* Reorders items so that the victims come first, oldest (smallest idle_since_ns) first,
 * ties by larger bytes, then by the order the caller listed them in (never by tag: a tag
 * may be a host address, which would make the choice depend on the host heap's layout);
 * takes items until their bytes reach target. Returns the number of
 * victims. now_ns is the caller's clock (items idle since later than now count as age 0). */
size_t _expseg_gc_select(expseg_gc_item_t *items, size_t n, size_t target, uint64_t now_ns);
/* Caps a collection target so that `keep` bytes of the `reclaimable` ones stay: collection
 * before a request must not release what the request itself could use (idle pages it
 * would otherwise move) and then be refused by the cap. */
size_t _expseg_gc_target_for_request(size_t target, size_t reclaimable, size_t keep);

#ifdef __cplusplus
}
#endif
#endif /* EXPSEG_POLICY_H */
