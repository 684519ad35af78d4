"""The software-managed cache's side of :class:`~neo.embedding.module.TableBatchedEmbedding`.

``CachedTables`` is a mixin of the module (the attributes it reads: ``_cache``, the
:class:`~neo.embedding.cache.ModuleCache` of its ``placement: cached`` tables or None, and
``validate``, ``feature_names``, ``feature_table``, ``_check_batch_ids`` for a prefetched
batch's checks): prefetching a batch's rows under the step before, writing dirty rows back,
the cache's counters, and a cached table's backing store for reads and writes by name.
"""

from __future__ import annotations

from typing import Dict, Sequence

from neo.config.embedding import TableConfig
from neo.embedding.cache import CacheStats
from neo.embedding.checks import check_features
from neo.embedding.placeholder import needs_tables
from neo.sparse import KeyedJaggedBatch

__all__ = ["CachedTables"]


class CachedTables:
    """Prefetch, flush and counters of the module's cached tables (see the module doc)."""

    @property
    @needs_tables
    def has_cache(self) -> bool:
        """True when some table is ``placement: cached``."""
        return self._cache is not None

    @needs_tables
    def prefetch(self, batch: KeyedJaggedBatch, future: Sequence[KeyedJaggedBatch] = ()) -> None:
        """Start making ``batch``'s cached rows resident on the cache's worker thread, for a
        training step that will look ``batch`` up (this same object) later; ``future``: the
        batches after it, nearest first (the lookahead policy's window). No-op without cached tables.

        Rows of batches prefetched and not yet done are never evicted, so prefetching batch
        i+1 while step i computes is safe; the lookup waits for what is not finished."""
        if self._cache is None:
            return
        if not isinstance(batch, KeyedJaggedBatch) or any(not isinstance(b, KeyedJaggedBatch) for b in future):
            # a prefetch is found again by the batch object itself: a KeyedJaggedTensor would be
            # converted anew by the lookup, and its prefetched rows never taken (left pinned)
            raise TypeError("prefetch takes the KeyedJaggedBatch objects the steps will look up: convert a "
                            "torchrec KeyedJaggedTensor once with neo.sparse.as_batch(kjt) and pass that object "
                            "to prefetch() and to the lookup")
        if self.validate:
            batch.ensure_checked()
            check_features(batch, self.feature_names, self.feature_table)
            self._check_batch_ids(batch)
        self._cache.prefetch_async(batch, future, train=True)

    @needs_tables
    def flush_cache(self) -> int:
        """Write every dirty cached row back to its store (before a checkpoint); rows written."""
        return 0 if self._cache is None else self._cache.flush()

    @needs_tables
    def cache_stats(self, settled: bool = False) -> Dict[str, CacheStats]:
        """Counters of every cached table (sums since creation); ``settled``: after the prefetches
        in flight have finished (exact per-step accounting, at the price of a wait)."""
        if self._cache is None:
            return {}
        if settled:
            self._cache.wait_idle()
        return self._cache.stats()

    def _store_view(self, cfg: TableConfig):
        """A cached table's backing store, with every dirty row written back (and the cache
        emptied when no batch is in flight, so that writes through the views are seen)."""
        cache = self._cache
        cache.flush()
        if cache.in_flight == 0:
            cache.drop()
        return cache.caches[cfg.name].store
