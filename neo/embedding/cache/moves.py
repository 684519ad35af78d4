"""How the cache's rows move: translating ids to slots, and copying rows out of and into slots.

- :class:`TorchMoves`: torch indexing (the CPU cache, and the reference the Triton path is
  tested against).
- :class:`TritonMoves`: the Triton kernels of :mod:`neo.embedding.backends.triton_cache_kernels`
  (the GPU cache; also CPU tensors under ``TRITON_INTERPRET=1``).

Both copy raw bits: a row written back and read in again is the same row.
"""

from __future__ import annotations

import torch

__all__ = ["TorchMoves", "TritonMoves", "moves_for"]


class TorchMoves:
    name = "torch"

    def slots_of(self, slot_of_row: torch.Tensor, ids: torch.Tensor, num_rows: int) -> torch.Tensor:
        """(n,) int64 slots of ``ids``; -1 for ids outside [0, num_rows)."""
        ids = ids.to(torch.int64)
        valid = (ids >= 0) & (ids < num_rows)
        out = torch.full_like(ids, -1)
        out[valid] = slot_of_row[ids[valid]].to(torch.int64)
        return out

    def gather(self, buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Copies of ``buf[slots]`` (rows of a (C, D) or (C,) buffer)."""
        return buf.index_select(0, slots)

    def take(self, row_slots: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """``row_slots[where]`` with -1 where ``where`` is -1: the slot of every id of a batch."""
        if where.numel() and int(where.min()) < 0:
            return torch.where(where >= 0, row_slots[where.clamp(min=0)], -1)
        return row_slots[where]

    def scatter(self, buf: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """``buf[slots] = rows``."""
        buf.index_copy_(0, slots, rows.to(buf.device, non_blocking=True))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A view Triton loads and stores bit for bit (bf16 as int16)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


class TritonMoves:
    name = "triton"
    block = 256

    def __init__(self) -> None:
        from neo.embedding.backends import triton_cache_kernels as k   # imports triton

        self.k = k

    def slots_of(self, slot_of_row: torch.Tensor, ids: torch.Tensor, num_rows: int) -> torch.Tensor:
        ids = ids.contiguous()
        out = torch.empty(ids.numel(), dtype=torch.int64, device=ids.device)
        if ids.numel():
            grid = (-(-ids.numel() // self.block),)
            self.k.slot_lookup_kernel[grid](ids, slot_of_row, out, ids.numel(), num_rows, BLOCK=self.block)
        return out

    def take(self, row_slots: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """The slot of every id: the slot lookup kernel on the batch's own small row -> slot map."""
        return self.slots_of(row_slots, where, row_slots.numel())

    def gather(self, buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        D = buf.shape[1] if buf.dim() == 2 else 1
        out = torch.empty((slots.numel(),) + tuple(buf.shape[1:]), dtype=buf.dtype, device=buf.device)
        if slots.numel():
            self.k.gather_rows_kernel[(slots.numel(),)](_bits(buf), _bits(out), slots.contiguous(), D,
                                                       BLOCK_D=_block_d(D))
        return out

    def scatter(self, buf: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
        D = buf.shape[1] if buf.dim() == 2 else 1
        if slots.numel():
            src = rows.to(device=buf.device, dtype=buf.dtype, non_blocking=True).contiguous()
            self.k.scatter_rows_kernel[(slots.numel(),)](_bits(src), _bits(buf), slots.contiguous(), D,
                                                        BLOCK_D=_block_d(D))


def _block_d(D: int) -> int:
    return min(1024, 1 << max(0, (D - 1).bit_length()))


def moves_for(backend_name: str):
    """The Triton data path for the triton backend, torch indexing otherwise."""
    return TritonMoves() if backend_name == "triton" else TorchMoves()
