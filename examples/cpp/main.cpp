// SPDX-License-Identifier: Apache-2.0
// main.cpp: expseg from C++: the C API behind a small owning wrapper (an allocator and a
// buffer released by their destructors), errors turned into exceptions with the library's
// message. Run: hello_cpp [DRIVER] (default "sim": no GPU needed).
#include <expseg.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

namespace {

void check(expseg_status s) {
  if (s != EXPSEG_OK) throw std::runtime_error(expseg_last_error());
}

struct Allocator {
  explicit Allocator(const char *driver, const char *config = "") {
    check(expseg_create(driver, 0, config, &a));
  }
  ~Allocator() { expseg_destroy(a); }
  Allocator(const Allocator &) = delete;
  Allocator &operator=(const Allocator &) = delete;
  std::int64_t stat(const char *key) const {
    std::int64_t v = 0;
    check(expseg_stat(a, key, &v));
    return v;
  }
  expseg_allocator *a = nullptr;
};

struct Buffer {
  Buffer(Allocator &al, std::size_t bytes) : owner(al) { check(expseg_malloc(al.a, bytes, 0, &p)); }
  ~Buffer() { expseg_free(owner.a, p); }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  Allocator &owner;
  void *p = nullptr;
};

} // namespace

int main(int argc, char **argv) {
  try {
    Allocator al(argc > 1 ? argv[1] : "sim", "expandable_segments:True");
    {
      Buffer a(al, std::size_t(64) << 20), b(al, std::size_t(200) << 20);
      std::printf("two buffers live: %lld bytes allocated, %lld reserved\n",
                  (long long)al.stat("allocated_bytes.all.current"),
                  (long long)al.stat("reserved_bytes.all.current"));
    }
    std::printf("after both freed: %lld bytes allocated, %lld still cached\n",
                (long long)al.stat("allocated_bytes.all.current"),
                (long long)al.stat("reserved_bytes.all.current"));
    Allocator bad("sim", "max_split_size_mb:abc"); // throws: the message names key and value
  } catch (const std::exception &e) {
    std::printf("as expected, an error: %s\n", e.what());
    return 0;
  }
  return 1;
}
