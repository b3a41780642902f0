// SPDX-License-Identifier: Apache-2.0
// block_pattern.h: a pattern written into a live block and checked later, for tests that
// must see busy memory never handed out: one 8-byte word (tag ^ offset) every `stride`
// bytes and ~tag in the last 8 bytes; a block under 8 bytes holds the tag's low byte.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

inline void pattern_put(char *p, size_t size, uint64_t tag, size_t stride) {
  if (size < 8) {
    std::memset(p, (int)(tag & 0xff), size);
    return;
  }
  for (size_t off = 0; off + 8 <= size; off += stride) {
    const uint64_t v = tag ^ off;
    std::memcpy(p + off, &v, 8);
  }
  const uint64_t last = ~tag;
  std::memcpy(p + size - 8, &last, 8);
}

// true when the pattern pattern_put wrote is intact; else false, and *why says where
inline bool pattern_ok(const char *p, size_t size, uint64_t tag, size_t stride,
                       std::string *why) {
  if (size < 8) {
    for (size_t i = 0; i < size; i++)
      if ((unsigned char)p[i] != (unsigned char)(tag & 0xff)) {
        *why = "byte " + std::to_string(i);
        return false;
      }
    return true;
  }
  uint64_t last;
  std::memcpy(&last, p + size - 8, 8);
  if (last != ~tag) {
    *why = "last word";
    return false;
  }
  for (size_t off = 0; off + 8 <= size - 8; off += stride) {
    uint64_t v;
    std::memcpy(&v, p + off, 8);
    if (v != (tag ^ off)) {
      *why = "word at offset " + std::to_string(off);
      return false;
    }
  }
  return true;
}
