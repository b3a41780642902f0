# SPDX-License-Identifier: Apache-2.0
"""stats.py: expseg's statistics and memory report from Python, without PyTorch.

    PYTHONPATH=PREFIX/share/expseg/python python3 stats.py      # an installed expseg
    python3 -m pip install ./python && python3 stats.py         # expseg.py from pip

expseg.py loads libexpseg_torch.so ($EXPSEG_TORCH_LIB, else beside expseg.py, the
repository's build folders or the installed lib folders; docs/torch.md). The driver comes
from $EXPSEG_DRIVER; this example asks for "sim" (no GPU needed) unless it is set.
"""
import os

os.environ.setdefault("EXPSEG_DRIVER", "sim")
import expseg  # noqa: E402  (after the driver is chosen)

stats = expseg.memory_stats(0)
print("library:", expseg.library_path())
print("driver:", expseg.driver(0))
print("allocations now:", stats["allocation.all.current"])
print("reserved bytes now:", stats["reserved_bytes.all.current"])
print(expseg.memory_summary(0).splitlines()[1])
