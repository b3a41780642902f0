/* SPDX-License-Identifier: Apache-2.0 */
/* reserve_class.c: expseg_stream_set_reserve_class, the streams' expandable-segment reserve
 * classes (PyTorch's setExpandableSegmentReserveClassForStream; docs/config.md,
 * expandable_segments_reserve_by_class).
 *
 * A tag is a (stream, name) pair in a small array, looked up by a linear walk: only when a
 * new expandable segment is reserved, and few streams are tagged (PyTorch tags a serving
 * stream or a capture stream, not every stream). The name is kept, not its reserve: the
 * reserve is read from the configuration in force when the segment is made, so
 * expseg_configure changes it for the segments that follow, as PyTorch re-parses. */
#include "error.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define RCLASS_NAME_MAX 64

typedef struct rclass_s {
  expseg_stream stream;
  char name[RCLASS_NAME_MAX];
} rclass_t;

const char *_expseg_reserve_class_of(const expseg_allocator *a, expseg_stream stream) {
  for (size_t i = 0; i < a->n_rclasses; i++)
    if (a->rclasses[i].stream == stream) return a->rclasses[i].name;
  return NULL;
}

void _expseg_reserve_classes_destroy(expseg_allocator *a) {
  free(a->rclasses);
  a->rclasses = NULL;
  a->n_rclasses = 0;
}

expseg_status expseg_stream_set_reserve_class(expseg_allocator *a, expseg_stream stream,
                                              const char *cls) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stream_set_reserve_class: the allocator is NULL");
  size_t n = cls ? strlen(cls) : 0;
  if (n >= RCLASS_NAME_MAX)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stream_set_reserve_class(stream 0x%llx, '%.40s...'): a "
                             "class name of %zu bytes; accepted: 1 to %d bytes",
                             (unsigned long long)stream, cls, n, RCLASS_NAME_MAX - 1);
  size_t bad = n ? strcspn(cls, ",:[] \t\n\r\f\v") : 0;
  if (bad < n)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stream_set_reserve_class(stream 0x%llx, '%s'): '%c' at "
                             "byte %zu cannot stand in a class name of "
                             "expandable_segments_reserve_by_class (',', ':', '[', ']' and "
                             "spaces are its separators)",
                             (unsigned long long)stream, cls, cls[bad], bad);
  if (stream >> EXPSEG_KEY_SHIFT)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stream_set_reserve_class(stream 0x%llx): not a stream value "
                             "(2^%d or above); accepted: a stream as expseg_malloc takes it",
                             (unsigned long long)stream, EXPSEG_KEY_SHIFT);
  expseg_status st = EXPSEG_OK;
  api_lock(a);
  size_t i = 0;
  while (i < a->n_rclasses && a->rclasses[i].stream != stream) i++;
  if (n == 0) { /* untag: the last entry takes its place */
    if (i < a->n_rclasses) a->rclasses[i] = a->rclasses[--a->n_rclasses];
  } else {
    if (i == a->n_rclasses) {
      rclass_t *p = realloc(a->rclasses, (a->n_rclasses + 1) * sizeof *p);
      if (p == NULL) {
        st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                               "expseg_stream_set_reserve_class: out of host memory");
      } else {
        a->rclasses = p;
        a->n_rclasses++;
      }
    }
    if (st == EXPSEG_OK) {
      a->rclasses[i].stream = stream;
      memcpy(a->rclasses[i].name, cls, n + 1);
    }
  }
  api_unlock(a);
  return st;
}
