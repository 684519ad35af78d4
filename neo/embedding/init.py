"""Initial values of embedding tables that do not depend on how the tables are placed.

A table starts uniform in ``[-scale, scale]``, drawn in blocks of :data:`INIT_BLOCK_ROWS` rows
by :data:`INIT_BLOCK_COLS` columns. Block ``(k, j)`` of table ``name`` (rows ``k * 4096 ...``,
columns ``j * 32 ...``; the last ones shorter) comes from its own generator, seeded from
``(seed, name, k, j)`` (:func:`block_seed`), row-major within the block. Element ``(r, c)`` of
a table therefore starts at the same value wherever it lives:

- alone or grouped with other tables in one :class:`~neo.embedding.TableBatchedEmbedding`, in
  any table order;
- split by rows, by columns or both across ranks (a shard draws the blocks it overlaps and
  keeps its rows and columns), or replicated on every rank;
- in fast memory or on a cached table's backing store.

So a model's starting point is a function of its seed and table configs alone, not of the
plan or the world size: an unsharded run and a sharded one start from the same weights,
and a re-planned job from the same weights as the first. (TorchRec draws each shard from its
rank's generator, so there the initial model depends on the plan.) A shard draws at most one
block's extra rows and columns at each edge, so C column shards of a table cost about one
table's draws in all, not C; the blocks are independent, so threads draw them at once.

Worked example: table ``t`` with 10,000 rows of D 64, row-wise on two ranks (rows 0-4,999
and 5,000-9,999). Rank 0 draws row blocks 0 and 1 (rows 0-8,191, both column blocks) and keeps
rows 0-4,999; rank 1 draws row blocks 1 and 2 (rows 4,096-9,999) and keeps rows 5,000-9,999.
Row block 1 is drawn on both ranks from the same seeds, so its rows 4,096-4,999 and
5,000-8,191 are those of the unsharded table. Split by columns instead (0-31 and 32-63), each
rank draws only its column block of every row block.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["INIT_BLOCK_ROWS", "INIT_BLOCK_COLS", "TableRegion", "block_seed", "fill_rows"]

INIT_BLOCK_ROWS = 4096
"""Rows of a block drawn from one generator."""
INIT_BLOCK_COLS = 32
"""Columns of a block drawn from one generator (128 bytes of fp32)."""


@dataclass(frozen=True)
class TableRegion:
    """Where a table's values sit in the table they are drawn for.

    A whole table is the region of itself (:meth:`whole`); a shard is the block of rows
    ``[row_offset, row_offset + rows)`` and columns ``[col_offset, col_offset + cols)`` of
    table ``table`` (``table_rows`` x ``table_dim``)."""

    table: str
    table_rows: int
    table_dim: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int

    @staticmethod
    def whole(name: str, num_rows: int, dim: int) -> "TableRegion":
        return TableRegion(name, num_rows, dim, 0, num_rows, 0, dim)

    def __post_init__(self):
        if not (0 <= self.row_offset and self.row_offset + self.rows <= self.table_rows
                and 0 <= self.col_offset and self.col_offset + self.cols <= self.table_dim):
            raise ValueError(f"table '{self.table}': region rows [{self.row_offset}, {self.row_offset + self.rows}) "
                             f"x columns [{self.col_offset}, {self.col_offset + self.cols}) is not inside its "
                             f"{self.table_rows} x {self.table_dim}")


def block_seed(seed: int, table: str, row_block: int, col_block: int) -> int:
    """The generator seed of block ``(row_block, col_block)`` of table ``table`` (63 bits of a
    keyed hash: stable across processes and Python versions, unlike ``hash()``)."""
    digest = hashlib.blake2b(f"{seed}/{table}/{row_block}/{col_block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def fill_rows(out: torch.Tensor, region: TableRegion, seed: int, scale: float, start: int = 0,
              threads: Optional[int] = None) -> None:
    """Write rows ``[start, start + M)`` of ``region``'s initial values into ``out`` (M, cols),
    float32: uniform in ``[-scale, scale]``, drawn block by block as the module doc says.

    ``threads`` (default ``torch.get_num_threads()``) draw blocks at once; the values do not
    depend on it."""
    m = out.shape[0]
    if out.dtype != torch.float32 or out.dim() != 2 or out.shape[1] != region.cols:
        raise ValueError(f"table '{region.table}': initial rows go to a float32 (M, {region.cols}) tensor, "
                         f"got {out.dtype} {tuple(out.shape)}")
    if not 0 <= start <= start + m <= region.rows:
        raise ValueError(f"table '{region.table}': rows [{start}, {start + m}) are outside its {region.rows} rows")
    if m == 0 or region.cols == 0:
        return
    r_lo = region.row_offset + start                   # rows [r_lo, r_hi) and columns [c_lo, c_hi) of the table
    r_hi = r_lo + m
    c_lo, c_hi = region.col_offset, region.col_offset + region.cols
    R, C = INIT_BLOCK_ROWS, INIT_BLOCK_COLS

    def draw(kj) -> None:
        k, j = kj
        b_r0, b_r1 = k * R, min((k + 1) * R, region.table_rows)         # the block: rows [b_r0, b_r1),
        b_c0, b_c1 = j * C, min((j + 1) * C, region.table_dim)          # columns [b_c0, b_c1)
        block = torch.empty(b_r1 - b_r0, b_c1 - b_c0, dtype=torch.float32)
        block.uniform_(-scale, scale, generator=torch.Generator().manual_seed(block_seed(seed, region.table, k, j)))
        r0, r1, c0, c1 = max(r_lo, b_r0), min(r_hi, b_r1), max(c_lo, b_c0), min(c_hi, b_c1)
        out[r0 - r_lo : r1 - r_lo, c0 - c_lo : c1 - c_lo].copy_(block[r0 - b_r0 : r1 - b_r0, c0 - b_c0 : c1 - b_c0])

    blocks = [(k, j) for k in range(r_lo // R, (r_hi - 1) // R + 1) for j in range(c_lo // C, (c_hi - 1) // C + 1)]
    workers = min(len(blocks), threads or torch.get_num_threads())
    if workers <= 1:
        for kj in blocks:
            draw(kj)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="neo-init") as pool:   # torch's kernels release the GIL
        for _ in pool.map(draw, blocks):
            pass
