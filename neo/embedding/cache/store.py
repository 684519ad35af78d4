"""Backing stores of cached tables: every row's weights and optimizer state, in slow memory.

- :class:`HostStore`: host memory, pinned when a GPU cache reads it (copies then run
  asynchronously, as FBGEMM's UVM-backed tables do).
- :class:`MmapStore`: a memory-mapped file on disk under a DRAM cache, so that a table larger
  than RAM trains. The file is created in the table's directory, its blocks reserved with
  ``posix_fallocate`` (a full disk is an error naming the table and the bytes before any row is
  written, never a half-written table or a SIGBUS later), mapped ``MAP_SHARED`` with
  ``MADV_RANDOM`` (no readahead), then unlinked: it disappears with the process, crash included
  (checkpoints hold the durable copy). Whenever the process's file-backed resident memory has
  grown by ``trim_bytes`` since the store was made, the store releases its mapped pages from
  the process (``MADV_DONTNEED``, which keeps their contents in the page cache and on disk), so
  its resident memory stays bounded, initialization included (a random row can map a whole
  large folio of the page cache, 64 KiB or more, so counting rows would not do).

Layout of both: ``weights`` (N, D) in the storage dtype, then ``states``: (N, D) fp32 per
element or (N,) fp32 per row, as the group buffers of :mod:`neo.embedding.layout`.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import shutil
import uuid
from typing import List, Optional, Sequence, Tuple

import torch

from neo.embedding.init import TableRegion, fill_rows

__all__ = ["BackingStore", "HostStore", "MmapStore", "CacheStoreError", "init_chunks"]

_INIT_CHUNK_ELEMS = 1 << 22


class CacheStoreError(RuntimeError):
    """A backing store cannot be created or used; the message names the table, the path and the numbers."""


def init_chunks(total: int, chunk: int = _INIT_CHUNK_ELEMS):
    """(start, end) element ranges of ``total`` in order (initialization streams through them)."""
    for a in range(0, total, chunk):
        yield a, min(total, a + chunk)


class BackingStore:
    """Rows of one table in slow memory; subclasses provide the tensors."""

    weights: torch.Tensor          # (N, D) storage dtype
    states: List[torch.Tensor]     # (N, D) or (N,) fp32

    def __init__(self, name: str, num_rows: int, dim: int, dtype: torch.dtype, state_rowwise: Sequence[bool]):
        self.name, self.num_rows, self.dim, self.dtype = name, num_rows, dim, dtype
        self.state_rowwise = list(state_rowwise)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row: its weights and optimizer state."""
        item = torch.empty(0, dtype=self.dtype).element_size()
        return self.dim * item + sum(4 if rw else 4 * self.dim for rw in self.state_rowwise)

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.row_bytes

    def read(self, rows: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Copies of rows ``rows`` (M,): weights (M, D) and states."""
        rows = rows.to(self.weights.device)
        out = self.weights.index_select(0, rows), [s.index_select(0, rows) for s in self.states]
        self.touched(int(rows.numel()))
        return out

    def write(self, rows: torch.Tensor, weights: torch.Tensor, states: Sequence[torch.Tensor]) -> None:
        """Store rows ``rows`` (M,) from weights (M, D) and states."""
        dev = self.weights.device
        rows = rows.to(dev)
        self.weights.index_copy_(0, rows, weights.to(dev))
        for s, v in zip(self.states, states):
            s.index_copy_(0, rows, v.to(dev))
        self.touched(int(rows.numel()))

    def initialize(self, region: TableRegion, seed: int, scale: float, state_init: Sequence[float]) -> None:
        """Weights: ``region``'s initial values (:mod:`neo.embedding.init`, the same numbers as
        the embedding module draws for a table in fast memory), written chunk by chunk; states
        filled with ``state_init``."""
        if (region.rows, region.cols) != (self.num_rows, self.dim):
            raise CacheStoreError(f"table '{self.name}': its store holds {self.num_rows} x {self.dim}, but its "
                                  f"initial region is {region.rows} x {region.cols}")
        rows_per_chunk = max(1, _INIT_CHUNK_ELEMS // self.dim)
        for a, b in init_chunks(self.num_rows, rows_per_chunk):
            chunk = torch.empty(b - a, self.dim, dtype=torch.float32)
            fill_rows(chunk, region, seed, scale, start=a)
            self.weights[a:b].copy_(chunk.to(self.dtype))
            self._written(self.weights[a:b])
        for s, v in zip(self.states, state_init):
            sf = s.view(-1)
            for a, b in init_chunks(sf.numel()):
                sf[a:b].fill_(v)
                self._written(sf[a:b])

    def touched(self, rows: int) -> None:
        """Hook: ``rows`` random rows were read or written (by :meth:`read`, :meth:`write`, or by the
        C++ row moves of a CPU cache, which copy into the tensors directly)."""

    def _written(self, span: torch.Tensor) -> None:
        """Hook: the contiguous ``span`` (a view of the store) was written in full."""

    def close(self) -> None:
        """Release the store (its data is gone)."""


class HostStore(BackingStore):
    """Every row in host memory (pinned when ``pin``: a GPU copies from it asynchronously)."""

    def __init__(self, name: str, num_rows: int, dim: int, dtype: torch.dtype, state_rowwise: Sequence[bool],
                 pin: bool = False):
        super().__init__(name, num_rows, dim, dtype, state_rowwise)
        try:
            self.weights = torch.empty(num_rows, dim, dtype=dtype, pin_memory=pin)
            self.states = [torch.empty((num_rows,) if rw else (num_rows, dim), dtype=torch.float32, pin_memory=pin)
                           for rw in self.state_rowwise]
        except RuntimeError as e:
            raise CacheStoreError(f"table '{name}': cannot allocate its host-memory store of {self.nbytes} bytes "
                                  f"({self.nbytes / 2**30:.2f} GiB): {e}") from None


def _shared_resident_bytes() -> int:
    """File-backed and shared resident memory of this process (``/proc/self/statm``, third field)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[2]) * mmap.PAGESIZE


def _safe(name: str) -> str:
    return re.sub(r"[^\w.#-]", "_", name)


class MmapStore(BackingStore):
    """Every row in a memory-mapped file under ``directory`` (see the module docstring).

    Args:
        trim_bytes: after this many bytes of rows read or written, the mapped pages are
            released from the process (its resident memory stays under about this much).
    """

    def __init__(self, name: str, num_rows: int, dim: int, dtype: torch.dtype, state_rowwise: Sequence[bool],
                 directory: str, trim_bytes: int = 256 << 20):
        super().__init__(name, num_rows, dim, dtype, state_rowwise)
        self.directory, self.trim_bytes = directory, trim_bytes
        self._baseline = _shared_resident_bytes()
        self.path = os.path.join(directory, f"neo-store-{_safe(name)}-{os.getpid()}-{uuid.uuid4().hex[:8]}.bin")
        self._mm: Optional[mmap.mmap] = None
        fd = self._create()
        try:
            self._mm = mmap.mmap(fd, self.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            # rows are read at random: no readahead, no fault-around (a row would map 64 KiB otherwise)
            self._mm.madvise(mmap.MADV_RANDOM)
        finally:
            os.close(fd)
            os.unlink(self.path)                 # the mapping keeps the data; nothing is left behind
        offset, item = 0, torch.empty(0, dtype=dtype).element_size()
        self.weights = torch.frombuffer(self._mm, dtype=dtype, count=num_rows * dim, offset=0).view(num_rows, dim)
        offset += num_rows * dim * item
        self.states = []
        for rw in self.state_rowwise:
            n = num_rows if rw else num_rows * dim
            t = torch.frombuffer(self._mm, dtype=torch.float32, count=n, offset=offset)
            self.states.append(t if rw else t.view(num_rows, dim))
            offset += 4 * n

    def _create(self) -> int:
        need = self.nbytes
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            raise CacheStoreError(f"table '{self.name}': cannot create its backing file in {self.directory!r} "
                                  f"({e.strerror}); set cache_dir (or train.cache_store_dir) to a writable "
                                  f"directory with {need / 2**30:.2f} GiB free") from None
        try:
            os.posix_fallocate(fd, 0, need)
        except OSError as e:
            os.close(fd)
            os.unlink(self.path)
            free = shutil.disk_usage(self.directory).free
            if e.errno == errno.ENOSPC:
                raise CacheStoreError(f"table '{self.name}': its backing file needs {need} bytes "
                                      f"({need / 2**30:.2f} GiB) but {self.directory!r} has {free} bytes "
                                      f"({free / 2**30:.2f} GiB) free") from None
            raise CacheStoreError(f"table '{self.name}': cannot reserve {need} bytes for its backing file in "
                                  f"{self.directory!r} ({e.strerror})") from None
        return fd

    def touched(self, rows: int) -> None:
        # What a random row maps depends on the kernel (a page, or a whole large folio of the page
        # cache): measure the process's file-backed resident memory instead of counting rows.
        if _shared_resident_bytes() - self._baseline > self.trim_bytes:
            self.trim()
            # what is resident after the trim is other memory (other mappings, other stores, data
            # files read through mmap): the next trim comes after this store's own trim_bytes more,
            # not at every access once the others have grown (audit of 2026-11-30)
            self._baseline = _shared_resident_bytes()

    def trim(self) -> None:
        """Release the mapped pages from the process (their contents stay in the file)."""
        if self._mm is not None:
            self._mm.madvise(mmap.MADV_DONTNEED)

    def _written(self, span: torch.Tensor) -> None:
        """Initialization streams through the file: its pages stay mapped until they pass
        ``trim_bytes``, as for any access. A store that fits (the usual case) then trains with
        every page mapped: no page fault at each first read or write-back of a row (docs/cache.md,
        "Backing stores")."""
        self.touched(0)

    def close(self) -> None:
        self.weights, self.states = None, []
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:              # tensors still view it: the mapping goes with them
                pass
            self._mm = None
