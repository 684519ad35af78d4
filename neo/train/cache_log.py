"""Cache statistics of a training run, per table, summed over every rank's shards.

Each rank's cached shards keep counters (:class:`neo.embedding.cache.CacheStats`); at every
log step the trainer waits for the prefetch in flight (so a window holds exactly the prefetches
launched in its steps), sums the counters per table across ranks (one AllReduce) and writes the counts
of the window since the previous record (``kind: "cache"`` in ``metrics.jsonl`` and
TensorBoard); the final summary carries the totals. At the end of the run one more window
holds what came after the last one (the last evaluation's lookups, the final write-back of dirty
rows), so that the windows add up to the totals.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from neo.embedding.cache import CacheStats

__all__ = ["CacheMonitor"]

_FIELDS = [f.name for f in fields(CacheStats)]


def _derived(d: Dict[str, float]) -> Dict[str, float]:
    out = dict(d)
    out["hit_rate"] = d["hits"] / d["accesses"] if d["accesses"] else None
    out["hidden_s"] = max(0.0, d["prefetch_s"] - d["exposed_s"])
    for k in ("batches", "accesses", "hits", "misses", "evictions", "writebacks", "bytes_in", "bytes_out"):
        out[k] = int(round(d[k]))
    return out


class CacheMonitor:
    """Sums the cache counters of ``sharded`` per table over the ranks of ``group``.

    Args:
        sharded: the rank's :class:`neo.distributed.ShardedEmbeddingCollection`.
        table_names: every cached table of the model (the same list on every rank).
        group: process group of all ranks, or None in one process.
    """

    def __init__(self, sharded, table_names: List[str], group=None):
        self.sharded, self.names, self.group = sharded, sorted(table_names), group
        self._last = {n: {k: 0.0 for k in _FIELDS} for n in self.names}

    @property
    def active(self) -> bool:
        return bool(self.names)

    def totals(self) -> Dict[str, Dict[str, float]]:
        """Counters per table since the start, every rank's shards summed (collective)."""
        local = torch.zeros(len(self.names), len(_FIELDS), dtype=torch.float64)
        row = {n: i for i, n in enumerate(self.names)}
        for shard, s in self.sharded.cache_stats(settled=True).items():
            i = row[shard.rsplit("#", 1)[0]]
            local[i] += torch.tensor([float(getattr(s, k)) for k in _FIELDS], dtype=torch.float64)
        if self.group is not None:
            dist.all_reduce(local, group=self.group)
        return {n: dict(zip(_FIELDS, local[i].tolist())) for n, i in row.items()}

    def window(self, now: Optional[Dict[str, Dict[str, float]]] = None) -> Dict[str, Dict[str, float]]:
        """Counters per table since the previous call (collective unless ``now``, :meth:`totals`, is given)."""
        now = now if now is not None else self.totals()
        out = {n: _derived({k: now[n][k] - self._last[n][k] for k in _FIELDS}) for n in self.names}
        self._last = now
        return out

    def summary(self, totals: Optional[Dict[str, Dict[str, float]]] = None) -> Dict[str, Dict[str, float]]:
        """Totals per table with hit rate and hidden prefetch time (collective unless given)."""
        totals = totals if totals is not None else self.totals()
        return {n: _derived(totals[n]) for n in self.names}
