"""Input checks of the embedding module: every failure names the feature and the table."""

from __future__ import annotations

from typing import Sequence, Tuple, Union

import torch

from neo.cpp import cpu_kernels
from neo.sparse import KeyedJaggedBatch


class EmbeddingInputError(ValueError):
    """Bad input to an embedding module (unknown feature, id out of range, wrong dtype)."""


def check_features(batch: KeyedJaggedBatch, expected: Sequence[str], feature_table: dict) -> None:
    keys = set(batch.keys)
    unread = [k for k in batch.keys if k not in feature_table]
    if unread:
        raise EmbeddingInputError(
            f"feature(s) {unread} are read by no table of this module (its features: {list(expected)})"
        )
    missing = [k for k in expected if k not in keys]
    if missing:
        raise EmbeddingInputError(
            f"the batch lacks feature(s) {missing}, read by table(s) {[feature_table[k] for k in missing]}"
        )
    if batch.values.dtype not in (torch.int32, torch.int64):
        raise EmbeddingInputError(f"ids must be int32 or int64, got {batch.values.dtype}")
    if batch.weights is not None and not batch.weights.is_floating_point():
        raise EmbeddingInputError(f"per-id weights must be floating point, got {batch.weights.dtype}")


def _bad_ids(values: torch.Tensor, offsets: torch.Tensor, batch_size: int,
             rows: Union[Sequence[int], torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(starts (F + 1,) int64: each feature's first id, then the end; bad (N,) bool: the ids
    outside ``[0, rows)`` of their feature's table), on ``values``' device."""
    rows = torch.as_tensor(rows, dtype=torch.int64, device=values.device)
    B = batch_size
    starts = (offsets[::B] if B else offsets[:1].repeat(rows.numel() + 1)).to(torch.int64)      # (F + 1,)
    limit = id_limits(rows, starts, values.numel(), search=values.device.type == "cuda")
    return starts, (values < 0) | (values >= limit)


def id_limits(rows: torch.Tensor, starts: torch.Tensor, n: int, search: bool) -> torch.Tensor:
    """(n,) int64: the rows of each id's table, ``rows[f]`` for the ids ``starts[f]:starts[f + 1]``.

    ``search``: each id's feature by a binary search of the F feature ends, for CUDA, where
    torch's repeat_interleave gives each of the F repeated values one thread that writes all of
    its copies (800 us at n = 5M on an H200, 2026-11-30; the search: a few elementwise passes).
    Otherwise repeat_interleave (fast on the CPU)."""
    if not search:
        return torch.repeat_interleave(rows, starts[1:] - starts[:-1], output_size=n)
    pos = torch.arange(n, device=rows.device)
    return rows[torch.bucketize(pos, starts[1:].contiguous(), right=True).clamp_(max=rows.numel() - 1)]


def check_ids(
    values: torch.Tensor,            # (N,) ids, feature-major in `features` order
    offsets: torch.Tensor,           # (F * B + 1,)
    batch_size: int,
    features: Sequence[str],
    rows: Union[Sequence[int], torch.Tensor],   # (F,): rows of the table each feature reads
    tables: Sequence[str],           # name of that table
) -> None:
    """Raise :class:`EmbeddingInputError` on the first id outside ``[0, rows)`` of its table."""
    if values.numel() == 0:
        return
    B = batch_size
    starts, bad = _bad_ids(values, offsets, B, rows)
    if not bool(bad.any()):
        return
    pos = int(bad.nonzero()[0])
    f = int(torch.searchsorted(starts[1:].contiguous().cpu(), torch.tensor(pos), right=True))
    bag = int(torch.searchsorted(offsets.cpu(), torch.tensor(pos), right=True)) - 1
    raise EmbeddingInputError(
        f"feature '{features[f]}' (table '{tables[f]}'): id {int(values[pos])} at sample {bag - f * B} "
        f"is out of range [0, {int(rows[f])}); {int(bad.sum())} id(s) out of range in this batch"
    )


def count_bad_ids(
    values: torch.Tensor,            # (N,) ids, feature-major
    offsets: torch.Tensor,           # (F * B + 1,)
    batch_size: int,
    rows: torch.Tensor,              # (F,) int64, on values' device: rows of the table each feature reads
) -> torch.Tensor:
    """(F,) int64 on ``values``' device: ids outside ``[0, rows)`` of their table, per feature
    (what ``validate=False`` lets the kernels skip). Nothing is copied to the host and nothing
    waits for the device: a caller may add the counts up and read them when asked.

    On the CPU one pass of ``neo._C.check_id_ranges`` (:func:`count_bad_ids_reference` takes
    six to eight: 3.2 ms against 0.3 at the multi-hot benchmark's 438k ids, one thread,
    tools/bench_id_check.py)."""
    return _check_ranges(values, offsets, batch_size, rows, to_int32=False)[0]


def count_bad_ids_to_int32(
    values: torch.Tensor,            # (N,) ids, feature-major
    offsets: torch.Tensor,           # (F * B + 1,)
    batch_size: int,
    rows: torch.Tensor,              # (F,) int64, on values' device
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(:func:`count_bad_ids`, the ids as int32 clamped to ``[-1, 2^31 - 1]`` (an invalid id stays
    invalid on an int32 wire)), in one pass on the CPU."""
    return _check_ranges(values, offsets, batch_size, rows, to_int32=True)


def _check_ranges(values: torch.Tensor, offsets: torch.Tensor, batch_size: int, rows: torch.Tensor,
                  to_int32: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(counts, the ids as clamped int32 if ``to_int32``): one pass of ``neo._C.check_id_ranges``
    where it applies (CPU tensors, a built extension, int32 / int64 ids, int64 row counts, offsets
    from 0), else the torch reference (and ``clamp``)."""
    _C = None
    if values.device.type == "cpu" and values.dtype in (torch.int32, torch.int64) and batch_size \
            and values.numel() and rows.device.type == "cpu" and rows.dtype == torch.int64:
        _C = cpu_kernels("check_id_ranges")
        starts = offsets[::batch_size].to(torch.int64).contiguous()                             # (F + 1,)
        if starts.numel() != rows.numel() + 1 or int(starts[0]) != 0:
            _C = None
    if _C is not None:
        return _C.check_id_ranges(values.contiguous(), starts, rows.contiguous(), to_int32)
    counts = count_bad_ids_reference(values, offsets, batch_size, rows)
    return counts, (values.clamp(-1, 2 ** 31 - 1).to(torch.int32) if to_int32 else values[:0].to(torch.int32))


def count_bad_ids_reference(
    values: torch.Tensor,            # (N,) ids, feature-major
    offsets: torch.Tensor,           # (F * B + 1,)
    batch_size: int,
    rows: torch.Tensor,              # (F,) int64, on values' device
) -> torch.Tensor:
    """:func:`count_bad_ids` in torch operations (any device; the oracle of the C++ pass)."""
    if values.numel() == 0:
        return torch.zeros(rows.numel(), dtype=torch.int64, device=values.device)
    starts, bad = _bad_ids(values, offsets, batch_size, rows)
    csum = torch.cat([torch.zeros(1, dtype=torch.int64, device=values.device), bad.to(torch.int64).cumsum(0)])
    return csum[starts[1:]] - csum[starts[:-1]]
