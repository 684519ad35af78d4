"""Whole tables out of a :class:`~neo.distributed.sharded_embedding.ShardedEmbeddingCollection`'s
shards, and its data-parallel replicas kept alike.

``ShardWeights`` is a mixin of the collection (the attributes it reads: ``tables``, ``plan``,
``pg``, ``lookup``, ``device``): copying full tables into this rank's shards
(:meth:`load_full_weights`), gathering them back on every rank (:meth:`full_weights`,
:meth:`full_optimizer_state`, collectives: an AllReduce of zero-padded shards, meant for tests
and small tables), broadcasting rank 0's data-parallel replicas at start and measuring how far
they drifted (:meth:`replica_drift`).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.distributed as dist

from neo.config.embedding import TableConfig
from neo.distributed.plan_view import ShardingType

__all__ = ["ShardWeights"]


class ShardWeights:
    """Full tables to and from this rank's shards; data-parallel replicas (see the module doc)."""

    def _local_shards(self, name: str):
        """(shard index, Shard) of table ``name`` on this rank."""
        return [(k, s) for k, s in enumerate(self.plan.tables[name].shards) if s.rank == self.pg.rank]

    @torch.no_grad()
    def load_full_weights(self, weights: Dict[str, torch.Tensor]) -> None:
        """Copy each table's slice into this rank's shards (``weights[name]``: (rows, D), full table).
        A table this collection does not have, or a tensor of another shape, is a ValueError naming
        it, before anything is copied."""
        configs = {t.name: t for t in self.tables}
        for name, full in weights.items():
            t = configs.get(name)
            if t is None:
                raise ValueError(f"load_full_weights: no table named {name!r} (tables: {sorted(configs)})")
            if not isinstance(full, torch.Tensor) or tuple(full.shape) != (t.num_rows, t.dim):
                got = tuple(full.shape) if isinstance(full, torch.Tensor) else type(full).__name__
                raise ValueError(f"load_full_weights: table {name!r} is {t.num_rows} x {t.dim}, the tensor "
                                 f"given is {got}")
        for name, full in weights.items():
            for k, s in self._local_shards(name):
                w = self.lookup.table_weight(f"{name}#{k}")
                w.copy_(full[s.row_offset:s.row_offset + s.rows, s.col_offset:s.col_offset + s.cols])

    @torch.no_grad()
    def full_weights(self, names: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
        """Gather full tables (fp32) on every rank. Collective: every rank must call it alike.

        Sums zero-padded shards with an AllReduce: meant for tests and small tables.
        Data-parallel tables come from rank 0's replica.
        """
        return self._gather(names, lambda local: self.lookup.table_weight(local).to(torch.float32), state=None)

    @torch.no_grad()
    def full_optimizer_state(self, names: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, torch.Tensor]]:
        """Gather optimizer state per table: (rows, D) per element, (rows,) per row. Collective.

        Per-row state of column-split tables comes from the first column shard.
        """
        out: Dict[str, Dict[str, torch.Tensor]] = {}
        for t in (self.tables if names is None else [x for x in self.tables if x.name in names]):
            out[t.name] = {}
            for sname in t.optimizer.type.state_names():
                g = self._gather([t.name], lambda local, n=sname: self.lookup.table_optimizer_state(local)[n], state=t)
                out[t.name][sname] = g[t.name]
        return out

    def _gather(self, names, read, state: Optional[TableConfig]) -> Dict[str, torch.Tensor]:
        out = {}
        for t in self.tables:
            if names is not None and t.name not in names:
                continue
            rowwise = state is not None and t.optimizer.type.rowwise_state
            buf = torch.zeros((t.num_rows,) if rowwise else (t.num_rows, t.dim), dtype=torch.float32,
                              device=self.device)
            st = self.plan.tables[t.name].sharding_type
            for k, s in self._local_shards(t.name):
                if st is ShardingType.DATA_PARALLEL and s.rank != 0:
                    continue
                if rowwise and s.col_offset != 0:
                    continue
                v = read(f"{t.name}#{k}").to(torch.float32)
                if rowwise:
                    buf[s.row_offset:s.row_offset + s.rows] = v
                else:
                    buf[s.row_offset:s.row_offset + s.rows, s.col_offset:s.col_offset + s.cols] = v
            if self.pg.world_size > 1:
                dist.all_reduce(buf, group=self.pg.world)
            out[t.name] = buf
        return out

    @torch.no_grad()
    def _broadcast_replicas(self) -> None:
        if self.pg.world_size == 1:
            return
        for t in self.tables:
            if self.plan.tables[t.name].sharding_type is ShardingType.DATA_PARALLEL:
                (k, _), = self._local_shards(t.name)
                w = self.lookup.table_weight(f"{t.name}#{k}")
                buf = w.to(torch.float32).contiguous()
                dist.broadcast(buf, src=0, group=self.pg.world)
                w.copy_(buf)

    def replica_drift(self) -> float:
        """Largest |difference| between data-parallel replicas and rank 0's (0.0 when identical). Collective."""
        worst = torch.zeros(1, device=self.device)
        for t in self.tables:
            if self.plan.tables[t.name].sharding_type is ShardingType.DATA_PARALLEL:
                (k, _), = self._local_shards(t.name)
                w = self.lookup.table_weight(f"{t.name}#{k}").to(torch.float32).contiguous()
                ref = w.clone()
                if self.pg.world_size > 1:
                    dist.broadcast(ref, src=0, group=self.pg.world)
                worst = torch.maximum(worst, (w - ref).abs().max().reshape(1))
        if self.pg.world_size > 1:
            dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=self.pg.world)
        return float(worst)
