/* SPDX-License-Identifier: Apache-2.0 */
/* oom.c: the out-of-memory report. When a request fails after every retry, the message says
 * what was asked, what the device and this allocator held at that moment (taken before the
 * page cache is given back, so its figures agree with the driver's own words in the cause),
 * and one hint chosen by what ran out: the whole device is too small for the request, one
 * expandable page or classic segment is larger than the device, the address space is
 * exhausted (many streams; va_reserve_mb named only for expandable segments, which it
 * sizes), the memory fraction caps the allocator, classic segments strand free memory, or
 * memory is simply full; then what else would have served it (other pools or streams, a
 * lower page_size_mb, or a lower chunk_max_mb where free whole pages are pinned by chunks
 * shared with blocks in use). The report costs time linear in the segments (the streams are
 * counted through a set). Observers then run with no lock held, and are told the device's
 * free memory after that give-back. */
#include "error.h"
#include "internal.h"
#include "release.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The streams holding segments: one walk into a set (the report must cost time linear in
 * the segments). 0 when host memory ran out for the set. */
static size_t count_streams(const expseg_allocator *a) {
  _expseg_map_t seen;
  if (!_expseg_map_init(&seen, a->n_segments)) return 0;
  for (const segment_t *s = a->segments; s; s = s->next_all)
    if (!_expseg_map_put(&seen, skey_stream(s->stream), 1)) break; /* streams, not pool keys */
  size_t n = _expseg_map_count(&seen);
  _expseg_map_free(&seen);
  return n;
}

/* What the request must create at the least: its pool's expandable page, or its classic
 * segment (sizes beyond the device, however large, compare as larger). */
static size_t unit_of(const expseg_allocator *a, size_t rounded) {
  if (a->cfg.expandable_segments)
    return _expseg_pool_page(a, _expseg_is_small(rounded) ? POOL_SMALL : POOL_LARGE);
  return _expseg_classic_segment_size(&a->cfg, rounded);
}

/* Free mapped memory at the failure, by how usable it was for the request at its place
 * (stream key, size pool): whole free pages and the rest (partly used pages, free blocks of
 * classic segments) there, free blocks on other streams' segments, in other pools; and the
 * address space reserved but unmapped in expandable segments. One walk of the blocks. */
typedef struct oomfree_s {
  size_t whole, partial, other_streams, other_pools, unmapped_va;
  size_t pinned; /* of whole: in chunks shared with a block in use (they cannot move) */
  size_t other_pools_live; /* of other_pools: in other private pools still in use */
} oomfree_t;

static oomfree_t free_by_use(const expseg_allocator *a, size_t rounded) {
  oomfree_t f = {0};
  const int kind = _expseg_is_small(rounded) ? POOL_SMALL : POOL_LARGE;
  for (const segment_t *s = a->segments; s; s = s->next_all) {
    if (s->expandable && s->va_size > s->mapped_bytes) f.unmapped_va += s->va_size - s->mapped_bytes;
    const bool here = seg_tag(s) == skey_tag(a->oom_key) && s->pool == kind;
    for (const block_t *b = s->first; b; b = b->next) {
      if (b->state != BLOCK_FREE || !b->mapped) continue;
      if (!here) {
        f.other_pools += b->size;
        if (seg_tag(s) != skey_tag(a->oom_key) && !_expseg_seg_general(a, s))
          f.other_pools_live += b->size; /* no trimming may take it (ppool.c) */
      } else if (s->stream != a->oom_key) {
        f.other_streams += b->size;
      } else {
        uintptr_t lo, hi;
        size_t w = _expseg_block_whole_pages(a, b, NULL) * s->page;
        f.whole += w;
        f.pinned += w - _expseg_block_chunks(a, b, &lo, &hi) * s->page;
        f.partial += b->size - w;
      }
    }
  }
  return f;
}

/* allocated: the bytes allocated with memory held behind them (a sleeping region's blocks
 * have none: memfig_t.asleep) */
static void hint(const expseg_allocator *a, size_t rounded, size_t allocated, size_t dev_free,
                 const oomfree_t *u, char *buf, size_t len) {
  size_t held = held_bytes(a);
  char b1[32], b2[32];
  expseg_oom_facts_t f = {.too_large = a->oom_kind == OOM_TOO_LARGE,
                          .address_space = a->oom_kind == OOM_ADDRESS_SPACE,
                          .expandable = a->cfg.expandable_segments,
                          .capped = a->allowed != SIZE_MAX,
                          .held = held,
                          .allocated = allocated,
                          .rounded = rounded,
                          .unit = unit_of(a, rounded),
                          .total = a->total_mem,
                          .partial = u->partial,
                          .other_streams = u->other_streams,
                          .other_pools = u->other_pools,
                          .other_pools_live = u->other_pools_live,
                          .whole = u->whole,
                          .pinned = u->pinned,
                          .device_free = dev_free,
                          .chunk_max = a->cfg.chunk_max};
  switch (_expseg_oom_hint(&f)) { /* policy/decide.c chooses, this writes the words */
  case EXPSEG_HINT_TOO_LARGE:
    snprintf(buf, len,
             "the request is larger than the whole device (%s): no setting can serve it; split "
             "the work or use a device with more memory",
             _expseg_format_size(b1, a->total_mem));
    break;
  case EXPSEG_HINT_UNIT_TOO_LARGE:
    snprintf(buf, len,
             "%s (%s) is larger than the whole device (%s): no batch size helps; set %s lower",
             a->cfg.expandable_segments ? "one expandable page"
                                        : "the classic segment this request needs",
             _expseg_format_size(b1, f.unit), _expseg_format_size(b2, a->total_mem),
             a->cfg.expandable_segments && !a->model_pytorch ? "page_size_mb"
                                                             : "large_segment_size_mb");
    break;
  case EXPSEG_HINT_ADDRESS_SPACE_CLASSIC:
    snprintf(buf, len,
             "the address space ran out, not memory: %s reserved in %zu classic segments on %zu "
             "streams (each reserves only its own size); give cached segments back "
             "(expseg_empty_cache), or use fewer streams",
             _expseg_format_size(b1, (uint64_t)a->stats.reserved_va_bytes.current),
             a->n_segments, count_streams(a));
    break;
  case EXPSEG_HINT_ADDRESS_SPACE:
    snprintf(buf, len,
             "the address space ran out, not memory: %s reserved in %zu segments on %zu "
             "streams; set va_reserve_mb lower to reserve less per segment, or use fewer "
             "streams",
             _expseg_format_size(b1, (uint64_t)a->stats.reserved_va_bytes.current),
             a->n_segments, count_streams(a));
    break;
  case EXPSEG_HINT_STRANDED:
    snprintf(buf, len,
             "%s is held but unallocated, split across segments: expandable_segments:True "
             "lets such memory serve one request",
             _expseg_format_size(b1, held - allocated));
    break;
  case EXPSEG_HINT_FRACTION:
    snprintf(buf, len,
             "the memory fraction %.3g caps this allocator at %s: raise it "
             "(per_process_memory_fraction or expseg_set_memory_fraction), or free memory",
             a->cfg.per_process_memory_fraction, _expseg_format_size(b2, a->allowed));
    break;
  case EXPSEG_HINT_FULL:
    snprintf(buf, len, "%s; free tensors you no longer need, or use smaller batches",
             a->cfg.expandable_segments
                 ? "expandable segments are on and nothing cached can serve it"
                 : "nothing cached can serve it");
    break;
  }
  size_t n = strlen(buf);
  switch (_expseg_oom_help(&f)) { /* what else would have served it */
  case EXPSEG_HELP_NONE: break;
  case EXPSEG_HELP_OTHER_POOLS:
    snprintf(buf + n, len - n, "; %s is free in other pools: release idle private pools "
             "(expseg_pool_release) or give cached memory back (expseg_empty_cache)",
             _expseg_format_size(b1, u->other_pools));
    break;
  case EXPSEG_HELP_LIVE_POOLS:
    snprintf(buf + n, len - n, "; %s is free in private pools still in use (a CUDA graph's, "
             "a MemPool's or a region's): expseg_empty_cache cannot give it back; release "
             "those pools (expseg_pool_release; in PyTorch, delete the graph or MemPool) once "
             "their tensors are freed, or give their free memory back now, their live blocks "
             "kept, with expseg_pool_empty_cache (a region's pool is never released)",
             _expseg_format_size(b1, u->other_pools_live));
    break;
  case EXPSEG_HELP_OTHER_STREAMS:
    snprintf(buf + n, len - n, "; %s is free on other streams whose work is still running: "
             "wait for those streams before this request", _expseg_format_size(b1, u->other_streams));
    break;
  case EXPSEG_HELP_PAGE_SIZE:
    snprintf(buf + n, len - n, "; %s is free in pages that live blocks share: a lower "
             "page_size_mb leaves less of it stranded", _expseg_format_size(b1, u->partial));
    break;
  case EXPSEG_HELP_CHUNK_MAX: {
    /* the setting to try: 4 pages, or half the one in force (a whole number of MB) */
    const size_t pg = _expseg_pool_page(a, _expseg_is_small(rounded) ? POOL_SMALL : POOL_LARGE);
    const size_t mb = (a->cfg.chunk_max == SIZE_MAX ? 4 * pg : a->cfg.chunk_max / 2) >> 20;
    char lower[48] = "a lower chunk_max_mb";
    if (mb > 0 && (size_t)mb << 20 >= pg) snprintf(lower, sizeof lower, "chunk_max_mb:%zu", mb);
    snprintf(buf + n, len - n, "; %s is free in whole pages that chunks shared with blocks in "
             "use pin: %s (smaller chunks) leaves less of it pinned; expseg-replay --fit shows "
             "the device size a recorded history needs with it",
             _expseg_format_size(b1, u->pinned), lower);
    break;
  }
  }
}

expseg_status _expseg_fail_oom(expseg_allocator *a, size_t size, size_t rounded,
                               expseg_stream stream, const char *cause_msg) {
  char cause[1024];
  snprintf(cause, sizeof cause, "%s", cause_msg); /* may be the thread's own message */
  a->stats.num_ooms++;
  /* PyTorch 2.12: a request the memory fraction refused before the driver was asked, under
   * throw_on_cudamalloc_oom (expseg always refuses it so; the key turns on the count) */
  if (a->oom_kind == OOM_FRACTION && a->cfg.throw_on_cudamalloc_oom) a->stats.num_oom_rejections++;
  size_t dev_free = 0, dev_total = 0;
  _expseg_vmm_mem_info(a->drv, &dev_free, &dev_total);
  EXPSEG_HIST(a, HIST_OOM, dev_free, rounded, stream);
  memfig_t fig = _expseg_memfig(a); /* the figures of expseg_memory_summary (summary.c) */
  size_t held = fig.reserved, allocated = fig.allocated, cached = fig.cached, largest = fig.largest_free;
  const size_t asleep = fig.asleep; /* allocated, but no memory held behind them */
  allocated -= asleep < allocated ? asleep : allocated;
  char slept[80] = "";
  if (asleep > 0)
    snprintf(slept, sizeof slept, " (and %s in sleeping regions, not held)",
             _expseg_format_size((char[32]){0}, asleep));
  char s1[32], s2[32], s3[32], s4[32], s5[32], s6[32], s7[32], s8[32], s9[32], s10[32];
  oomfree_t u = free_by_use(a, rounded);
  a->stats.oom_largest_free_block = (int64_t)largest;
  a->stats.oom_free_whole_page_bytes = (int64_t)u.whole;
  a->stats.oom_free_pinned_bytes = (int64_t)u.pinned;
  a->stats.oom_free_partial_bytes = (int64_t)u.partial;
  a->stats.oom_free_other_stream_bytes = (int64_t)u.other_streams;
  a->stats.oom_free_other_pool_bytes = (int64_t)u.other_pools;
  a->stats.oom_unmapped_va_bytes = (int64_t)u.unmapped_va;
  char s11[32], s12[32], s13[32], s14[32], s15[32];
  char why[640], cap[96] = "";
  /* the pages the failed growth created sit in the page cache and go back below: to the
   * help they are the device's free memory */
  hint(a, rounded, allocated, dev_free + (size_t)a->stats.cached_physical_bytes.current, &u, why,
       sizeof why);
  if (a->allowed != SIZE_MAX)
    snprintf(cap, sizeof cap, " %s allowed (memory fraction %.3g).",
             _expseg_format_size(s10, a->allowed), a->cfg.per_process_memory_fraction);
  char msg[3200];
  int n = snprintf(msg, sizeof msg,
                   "out of memory: tried to allocate %s (%zu bytes, rounded to %s, %s pool, "
                   "stream %#llx) on device %d. The device has %s in total, %s free.%s This "
                   "allocator holds %s: %s allocated%s, %s cached (%s as unmapped pages), "
                   "largest free block %s. Free: %s in whole pages, %s in partly used pages "
                   "or classic segments, %s on other streams, %s in other pools; %s of "
                   "reserved address space unmapped. Hint: %s. [%s]",
                   _expseg_format_size(s1, size), size, _expseg_format_size(s2, rounded),
                   _expseg_is_small(rounded) ? "small" : "large", (unsigned long long)stream,
                   a->device, _expseg_format_size(s3, dev_total), _expseg_format_size(s4, dev_free),
                   cap, _expseg_format_size(s5, held), _expseg_format_size(s6, allocated), slept,
                   _expseg_format_size(s7, held > allocated ? held - allocated : 0),
                   _expseg_format_size(s8, cached),
                   _expseg_format_size(s9, largest), _expseg_format_size(s11, u.whole),
                   _expseg_format_size(s12, u.partial), _expseg_format_size(s13, u.other_streams),
                   _expseg_format_size(s14, u.other_pools), _expseg_format_size(s15, u.unmapped_va),
                   why, cause);
  /* pages created for this request before the device ran out help no one: the page cache
   * goes back now; the figures above are those of the failure */
  size_t given = _expseg_cache_trim(a, 0);
  if (given > 0) _expseg_vmm_mem_info(a->drv, &dev_free, &dev_total);
  if (given > 0 && n > 0 && (size_t)n < sizeof msg)
    snprintf(msg + n, sizeof msg - (size_t)n,
             " Then %s of cached pages went back to the device (now %s free).",
             _expseg_format_size(s1, given), _expseg_format_size(s2, dev_free));
  size_t n_obs = a->n_observers;
  observer_t local[8];
  observer_t *obs = n_obs <= 8 ? local : malloc(n_obs * sizeof *obs);
  if (obs == NULL) n_obs = 0;
  else if (n_obs > 0) memcpy(obs, a->observers, n_obs * sizeof *obs);
  size_t third = a->allowed != SIZE_MAX ? a->allowed : dev_total;
  int device = a->device;
  api_unlock(a);
  for (size_t i = 0; i < n_obs; i++) obs[i].fn(obs[i].ctx, device, rounded, third, dev_free);
  if (obs != local) free(obs);
  return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "%s", msg);
}
