# SPDX-License-Identifier: Apache-2.0
"""sleep_wake.py: give a region's device memory back and restore it at the same addresses.

    PYTHONPATH=python python3 examples/python/sleep_wake.py     # from the repository, built

Under PyTorch (expseg.install() first) the same three calls wrap a model:

    with expseg.region("weights"):
        model = build_model().cuda()          # weights in the region's own segments
    expseg.sleep("weights")                   # device memory back to the driver, bytes on host
    ...                                       # another engine uses the GPU
    expseg.wake("weights")                    # same addresses: model and graphs still valid

This example needs no GPU and no PyTorch: it runs on the "host" driver (device memory is
ordinary memory of this process), allocates through the library's entry point and reads
the bytes back with ctypes.
"""
import ctypes
import os

os.environ.setdefault("EXPSEG_DRIVER", "host:capacity=256M")
import expseg  # noqa: E402  (after the driver is chosen)

lib = expseg._load()
size = 32 << 20
with expseg.region("weights"):
    ptr = lib.expseg_torch_alloc(size, 0, None)
if not ptr:
    raise SystemExit("allocation failed: " + expseg.last_error())
pattern = bytes(range(256)) * (size // 256)
ctypes.memmove(ptr, pattern, size)


def reserved():
    return expseg.memory_stats()["reserved_bytes.all.current"] >> 20


print("awake:  pointer %#x, %d MiB reserved" % (ptr, reserved()))
expseg.sleep("weights")
print("asleep: %d MiB reserved (the addresses stay reserved)" % reserved())
expseg.wake("weights")
same = ctypes.string_at(ptr, size) == pattern
print("awake:  pointer %#x, %d MiB reserved, bytes %s" % (ptr, reserved(),
                                                          "intact" if same else "CHANGED"))
lib.expseg_torch_free(ptr, size, 0, None)
if not same:
    raise SystemExit("the bytes changed across sleep and wake")
