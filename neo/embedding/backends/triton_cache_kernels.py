"""Triton kernels of the embedding cache's data path (see :mod:`neo.embedding.cache.moves`).

- :func:`slot_lookup_kernel`: ids -> cache slots through the row-to-slot map (ids outside
  ``[0, num_rows)`` become -1, which every lookup kernel skips); a program per ``BLOCK`` ids.
- :func:`gather_rows_kernel`: rows ``src[slots[i]]`` -> ``dst[i]`` (dirty rows on their way
  back to the store: write-back); a program per row, ``BLOCK_D`` columns at a time.
- :func:`scatter_rows_kernel`: ``src[i]`` -> ``dst[slots[i]]`` (rows read from the store into
  the slots eviction freed: miss insertion).

Rows are copied as raw bits (bf16 buffers arrive as an int16 view), so a row leaves and
returns exactly. Which rows move and where is decided by :class:`neo.embedding.cache.index.
CacheIndex` (torch ops on the cache's device); these kernels move the data.

Imported lazily (it imports triton); under ``TRITON_INTERPRET=1`` the same kernels run on CPU
tensors, which is how the tests check them against the torch data path.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def slot_lookup_kernel(ids_ptr, slot_of_row_ptr, out_ptr, n, num_rows, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    r = tl.load(ids_ptr + offs, mask=inside, other=-1).to(tl.int64)
    valid = inside & (r >= 0) & (r < num_rows)
    s = tl.load(slot_of_row_ptr + r, mask=valid, other=-1).to(tl.int64)      # never read for invalid ids
    tl.store(out_ptr + offs, tl.where(valid, s, -1), mask=inside)


@triton.jit
def gather_rows_kernel(src_ptr, dst_ptr, slots_ptr, D, BLOCK_D: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        m = d0 + cols < D
        v = tl.load(src_ptr + slot * D + d0 + cols, mask=m)
        tl.store(dst_ptr + i * D + d0 + cols, v, mask=m)


@triton.jit
def scatter_rows_kernel(src_ptr, dst_ptr, slots_ptr, D, BLOCK_D: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        m = d0 + cols < D
        v = tl.load(src_ptr + i * D + d0 + cols, mask=m)
        tl.store(dst_ptr + slot * D + d0 + cols, v, mask=m)
