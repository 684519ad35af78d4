"""Ids outside their table's rows: each feature's range, the check that names a bad id, and the
count of those a lookup skips.

:class:`InvalidIds` serves :class:`~neo.embedding.TableBatchedEmbedding` (``validate`` and
``skipped_ids``) and :class:`~neo.distributed.input_dist.InputDist` (its source-side count). The
counts are added up where the ids are (no wait for the device per batch) and read only when
reported, per table.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Sequence

import torch

from neo.embedding.checks import check_ids, count_bad_ids

__all__ = ["InvalidIds"]


class InvalidIds:
    """Per feature, in the order of the ids it is given: its table's name and rows, and the ids
    counted outside ``[0, rows)``."""

    def __init__(self, features: Sequence[str], tables: Sequence[str], rows: Sequence[int],
                 device: torch.device | str | None = None):
        self.features, self.tables = list(features), list(tables)                       # per feature
        self.rows = torch.tensor(list(rows), dtype=torch.int64, device=device)         # (F,)
        self.counts = torch.zeros(len(self.features), dtype=torch.int64, device=device)  # (F,)

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """``nn.Module._apply``'s function on both tensors (int64: a change of device only)."""
        self.rows, self.counts = fn(self.rows), fn(self.counts)

    def on(self, device: torch.device) -> torch.Tensor:
        """(F,) rows on ``device``; the counts move with them."""
        if self.rows.device != device:
            self.apply(lambda t: t.to(device))
        return self.rows

    def check(self, values: torch.Tensor, offsets: torch.Tensor, batch_size: int) -> None:
        """Raise :class:`~neo.embedding.checks.EmbeddingInputError` naming feature, table, sample
        and id at the first id out of range (``values`` (N,) int64 feature-major, ``offsets``
        (F * B + 1,))."""
        check_ids(values, offsets, batch_size, self.features, self.on(values.device), self.tables)

    def count(self, values: torch.Tensor, offsets: torch.Tensor, batch_size: int) -> None:
        """Add a batch's ids out of range to the counts (one pass, no host read)."""
        self.add(count_bad_ids(values, offsets, batch_size, self.on(values.device)))

    def add(self, counts: torch.Tensor) -> None:
        """Add (F,) counts made elsewhere (on the counts' device; no host read)."""
        self.counts += counts

    def kernel_counts(self) -> torch.Tensor:
        """(F,) int32 zeros for a backend to add each feature's invalid ids into as it looks up
        (``counts_invalid_per_feature``: triton), then :meth:`settle`."""
        return torch.zeros(len(self.features), dtype=torch.int32, device=self.counts.device)

    def settle(self, counts: torch.Tensor, check: bool, name_bad_id: Callable[[], None]) -> None:
        """Counts a kernel made (:meth:`kernel_counts`): with ``check``, one host read and, where
        any id was out of range, ``name_bad_id()`` (which raises, naming it); without, added to
        the counts on the device."""
        if not check:
            self.add(counts)
        elif bool(counts.any()):
            self.name_counted(name_bad_id)

    @staticmethod
    def name_counted(name_bad_id: Callable[[], None]) -> None:
        """A kernel counted an invalid id: ``name_bad_id()`` raises, naming it; if it finds none,
        the count and the check disagree, which is a bug."""
        name_bad_id()
        raise AssertionError("the kernel counted invalid ids that the id check did not find")

    def per_table(self, tables: Iterable[str]) -> Dict[str, int]:
        """The counts summed per table (every name in ``tables``, zero where none); one host read."""
        out = {t: 0 for t in tables}
        for t, n in zip(self.tables, self.counts.tolist()):
            out[t] += n
        return out
