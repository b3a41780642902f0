// SPDX-License-Identifier: Apache-2.0
// chunk_support.h: the physical chunks a growth creates, from the policy's own functions,
// for tests whose expectations depend on chunk sizes: a growth of `growth` bytes at the
// start of an empty place, serving a request of `request` bytes placed there, creates
// chunks of these sizes in this order (policy.h: _expseg_request_pages, _expseg_chunk_pages).
#pragma once
#include "policy.h"

#include <cstddef>
#include <vector>

inline std::vector<size_t> growth_chunk_sizes(size_t growth, size_t request,
                                              size_t page = (size_t)2 << 20) {
  const size_t pages = (growth + page - 1) / page;
  const size_t whole = request / page < pages ? request / page : pages;
  const size_t mine = _expseg_request_pages(pages, whole, page, request);
  std::vector<size_t> out;
  for (size_t left = pages; left > 0;) {
    const size_t done = pages - left;
    const size_t k = done < mine ? _expseg_chunk_pages(false, mine - done, page, true, pages)
                                 : _expseg_chunk_pages(false, left, page, false, pages);
    out.push_back(k * page);
    left -= k;
  }
  return out;
}
