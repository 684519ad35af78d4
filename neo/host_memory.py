"""Host memory of a training process: freed memory kept for reuse, and transparent huge pages.

glibc's malloc serves blocks above a dynamic threshold (128 KiB to 32 MiB) with ``mmap`` and
returns them to the kernel on ``free``. A training step allocates and frees the same large
tensors every step (pooled embeddings, AlltoAll buffers, activations and gradients: a few
MiB each), so each step maps them afresh and the kernel zero-fills every page on first touch.
On a 2-core machine this was about a third of a DLRM step's CPU time spent in the kernel.

:func:`retain_freed_memory` raises glibc's mmap threshold to its maximum (32 MiB, so such
tensors come from the heap) and its trim threshold (so the heap is not shrunk after each
step): the second step on reuses the same pages. The cost is that the process keeps its peak
heap. Other allocators (jemalloc, tcmalloc preloaded with ``LD_PRELOAD``) keep memory by
themselves; on non-glibc systems this does nothing.

:func:`request_huge_pages` (called when ``neo`` is imported) asks PyTorch's CPU allocator to
mark every allocation of 2 MiB or more ``MADV_HUGEPAGE`` (its ``THP_MEM_ALLOC_ENABLE``
variable, c10's ``alloc_cpu``), so that where transparent huge pages are in ``madvise`` mode
(``/sys/kernel/mm/transparent_hugepage/enabled``) those buffers are backed by 2 MiB pages:
one TLB entry instead of 512, which matters most under virtualization, where a TLB miss walks
two page tables. torch reads the variable at the process's first such allocation, so it is
set at import, before any; a value already in the environment is left as it is
(``THP_MEM_ALLOC_ENABLE=0`` turns it off), and nothing is set where the kernel has no THP.
Measured on a 2-core AMD EPYC VM (madvise mode), fp32, one thread: the fused dot interaction
at B 2048, n 27, D 64 from 4.8-5.8 to 4.2-4.4 ms forward + backward; a table-wise DLRM step of
``tools/bench_train.py`` (one-hot) about 5-10% faster (docs/benchmarks.md). Neo's kernels
advise the tables' buffers themselves either way (``csrc/hugepages.cpp``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameters of glibc's <malloc.h>
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20      # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30       # keep up to 1 GiB of free heap top
TOP_PAD = 64 << 20             # grow the heap in 64 MiB steps

_applied = False


def retain_freed_memory() -> bool:
    """Tune glibc malloc as described in the module doc; True if applied (idempotent)."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(p, v) == 1 for p, v in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                              (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD)))
    _applied = ok
    return ok


THP_ENV = "THP_MEM_ALLOC_ENABLE"
"""PyTorch's switch for ``MADV_HUGEPAGE`` on its CPU allocations of 2 MiB or more."""


def request_huge_pages() -> bool:
    """Set ``THP_MEM_ALLOC_ENABLE=1`` unless the environment already has a value (see the
    module doc); True if huge pages are requested after the call. Linux kernels with THP only:
    elsewhere torch's ``madvise`` would fail and warn (or, off Linux, torch ignores the
    variable), so nothing is set. It takes effect only if this process has not yet made a
    torch CPU allocation of 2 MiB or more."""
    if THP_ENV not in os.environ and (not sys.platform.startswith("linux")
                                      or transparent_hugepage_mode() == "unavailable"):
        return False
    os.environ.setdefault(THP_ENV, "1")
    return os.environ[THP_ENV] == "1"


def transparent_hugepage_mode() -> str:
    """The kernel's THP mode (``always``, ``madvise`` or ``never``), or ``unavailable``."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return "unavailable"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "unavailable"
