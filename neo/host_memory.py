"""Keep freed host memory inside the process, so a training step reuses it without page faults.

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
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
