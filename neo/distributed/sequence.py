"""Unpooled ("sequence") lookups of a :class:`ShardedEmbeddingCollection`: one embedding per id,
as TorchRec's sharded ``EmbeddingCollection`` gives, under the same plan as the pooled lookups.

A batch's path (rank r, B local samples, W ranks)::

    batch (B samples)
      -> input_dist(batch)         the pooled path's two AlltoAlls: each slot (feature x shard)
                                   receives its ids from all W ranks (row-split tables: each id to
                                   the shard of its row, re-based; column-split: to every shard)
      -> lookup.sequence(local)    the local module's unpooled lookup: per slot, one row per id of
                                   the W * B samples, source-major (neo.embedding.sequence)
      -> one AlltoAll of the rows back to the ranks their ids came from: to rank s, for each of
         this rank's slots in slot order, the rows of s's ids (flattened: slots differ in width);
         data-parallel tables take their own samples' rows from the local replica instead
      -> per feature: column shards side by side (column order), row shards put back in the
         order of the ids (a stable sort of the ids by shard gives the order they arrived in)
      -> {feature: SequenceEmbedding(values (N_f, D), lengths (B,))}

Backward: the same AlltoAll the other way (the rows' gradients, times ``grad_scale``: 1 / W
with ``average_gradients``, as for pooled lookups) and each shard's fused update on its ids.
Data-parallel replicas: each rank's gradient rows are sent to every replica (an AlltoAll
carrying the same block to each rank), so that every replica applies the global batch's update
and replicas stay identical, as pooled (:mod:`.sharding.data_parallel`).

Equivalence: with ``average_gradients`` the update equals one unsharded module's trained on the
global batch (rank r's samples r*B .. (r+1)*B-1) under the loss (1 / W) sum_r loss_r, the same
contract as pooled lookups (tested for every sharding type against the unsharded module).

Cached shards work as in :mod:`neo.embedding.sequence` (``prefetch`` of the distributed batch
first, or a prefetch at the lookup). Not supported (each a clear error on every rank, before any
collective): per-id weights, and backends other than those of :mod:`neo.embedding.sequence`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Dict, List, Tuple

import torch

from neo.distributed.comms import BackwardOrder, all_to_all_pooled, slice_local_varlen
from neo.distributed.plan_view import ShardingType
from neo.distributed.slots import Slot
from neo.embedding.checks import EmbeddingInputError
from neo.embedding.sequence import SEQUENCE_BACKENDS, SequenceEmbedding
from neo.sparse import KeyedJaggedBatch

if TYPE_CHECKING:
    from neo.distributed.sharded_embedding import ShardedEmbeddingCollection

__all__ = ["sharded_sequence_lookup"]

_DP = ShardingType.DATA_PARALLEL


class _Unpack(torch.autograd.Function):
    """Forward: ``x`` (n,) cut into pieces of ``sizes`` (views, no copy). Backward: the pieces'
    gradients times ``scale`` (the collection's 1 / W) written into one buffer, one pass (what
    ``torch.split`` and a separate scaling would do in two)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, sizes: List[int], scale: float):
        ctx.sizes, ctx.scale = sizes, scale
        return tuple(torch.split(x, sizes))

    @staticmethod
    def backward(ctx, *grads):
        out = grads[0].new_empty(sum(ctx.sizes)) if grads else torch.zeros(0)
        for part, g in zip(torch.split(out, ctx.sizes), grads):
            if g is None:
                part.zero_()
            else:
                torch.mul(g.reshape(-1), ctx.scale, out=part)
        return out, None, None


def _check(sec: "ShardedEmbeddingCollection", batch: KeyedJaggedBatch) -> None:
    """What every rank can decide alone from the plan and its batch, before any collective."""
    if batch.weights is not None:
        raise EmbeddingInputError("unpooled lookups (sequence) take no per-sample weights: the batch has weights")
    if sec.lookup is not None and sec.lookup.backend_name not in SEQUENCE_BACKENDS:
        raise EmbeddingInputError(f"unpooled lookups (sequence) run on the {list(SEQUENCE_BACKENDS)} backends, "
                                  f"not '{sec.lookup.backend_name}'")


class _RowShards:
    """One feature's ids split by the row shards of one column group, as input_dist split them:
    ``counts[k]`` of them went to shard k (stable order); ids outside the table (possible only
    with ``validate=False``) went nowhere and come back as zero rows."""

    def __init__(self, ids: torch.Tensor, slots: List[Slot]):
        self.slots = sorted(slots, key=lambda s: s.row_offset)
        bounds = torch.tensor([s.row_offset for s in self.slots[1:]], dtype=torch.int64)
        shard = torch.bucketize(ids, bounds, right=True)                               # (N,) in [0, shards)
        shard[(ids < 0) | (ids >= self.slots[0].table_rows)] = len(self.slots)          # after every shard
        self.counts = torch.bincount(shard, minlength=len(self.slots) + 1).tolist()
        perm = torch.argsort(shard, stable=True)                                        # arrival order -> id
        self.places = list(torch.split(perm, self.counts))[:-1]                          # shard k's ids' places
        self.n = ids.numel()

    def count(self, slot: Slot) -> int:
        return self.counts[self.slots.index(slot)]

    def restore(self, pieces: List[torch.Tensor]) -> torch.Tensor:
        """(N, cols): the shards' rows (in ``self.slots`` order) back in id order."""
        return _Scatter.apply(self.n, self.counts[-1] > 0, self.places, *pieces)


class _Scatter(torch.autograd.Function):
    """Forward: ``pieces[k]`` into rows ``places[k]`` of an (n, cols) output (zeros where no piece
    goes, only when ``holes``). Backward: each piece's gradient gathered from those rows. One
    pass each way: no concatenation of the pieces, no zero-filled gradient scattered into."""

    @staticmethod
    def forward(ctx, n: int, holes: bool, places: List[torch.Tensor], *pieces: torch.Tensor):
        ctx.places = places
        cols = pieces[0].shape[1]
        out = pieces[0].new_zeros(n, cols) if holes else pieces[0].new_empty(n, cols)
        for where, piece in zip(places, pieces):
            out.index_copy_(0, where, piece)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (None, None, None) + tuple(grad.index_select(0, where) for where in ctx.places)


class _Arrivals:
    """How many rows of each slot of every rank come back to this rank: its own ids, routed as
    input_dist routed them (no communication: the plan and the ids decide)."""

    def __init__(self, sec: "ShardedEmbeddingCollection", batch: KeyedJaggedBatch):
        self.layout = sec.layout
        self.ids = {f: batch.feature(f)[0].to(torch.int64) for f in self.layout.features}
        self.splits: Dict[Tuple[str, int], _RowShards] = {}

    def count(self, slot: Slot) -> int:
        if slot.full_rows:
            return self.ids[slot.feature].numel()
        return self.row_shards(slot.feature, slot.col_offset).count(slot)

    def row_shards(self, feature: str, col_offset: int) -> _RowShards:
        key = (feature, col_offset)
        if key not in self.splits:
            group = [s for s in self.layout.slots_of_feature(feature) if s.col_offset == col_offset]
            self.splits[key] = _RowShards(self.ids[feature], group)
        return self.splits[key]

    def assemble(self, feature: str, pieces: Dict[Slot, torch.Tensor]) -> torch.Tensor:
        """(N, D): column shards side by side, row shards back in id order."""
        groups: Dict[int, List[Slot]] = defaultdict(list)
        for sl in pieces:
            groups[sl.col_offset].append(sl)
        cols = []
        for c in sorted(groups):
            group = groups[c]
            if len(group) == 1 and group[0].full_rows:
                cols.append(pieces[group[0]])
            else:
                split = self.row_shards(feature, c)
                cols.append(split.restore([pieces[sl] for sl in split.slots]))
        return cols[0] if len(cols) == 1 else torch.cat(cols, dim=1)


def sharded_sequence_lookup(sec: "ShardedEmbeddingCollection",
                            batch: KeyedJaggedBatch) -> Dict[str, SequenceEmbedding]:
    """Every feature's embeddings of this rank's samples, one row per id (module doc)."""
    _check(sec, batch)
    W, me = sec.pg.world_size, sec.pg.rank
    dist_batch = sec.input_dist(batch, weigh=False).wait()     # no weights: a weight_table's slots stay home
    mine = sec.layout.slots_on[me]
    rows: Dict[str, SequenceEmbedding] = sec.lookup.sequence(dist_batch.local) if sec.lookup is not None else {}
    # counts[k][s]: ids of source s in local slot k (its rows are source-major)
    counts = dist_batch.local.lengths.view(len(mine), W, dist_batch.batch_size).sum(-1).tolist() if mine else []
    order = BackwardOrder(sec.timers)
    values: Dict[str, torch.Tensor] = {}
    if any(t is not _DP for t in sec.plan.types()):
        values.update(_exchange(sec, rows, counts, _Arrivals(sec, batch), order))
    if _DP in sec.plan.types():
        values.update(_data_parallel(sec, rows, counts, order))
    return {f: SequenceEmbedding(values[f], batch.feature(f)[1]) for f in batch.keys}


def _exchange(sec: "ShardedEmbeddingCollection", rows: Dict[str, SequenceEmbedding], counts: List[List[int]],
              arrivals: _Arrivals, order: BackwardOrder) -> Dict[str, torch.Tensor]:
    """Every sharded (not data-parallel) slot's rows back to their ids' ranks, one AlltoAll."""
    layout, W = sec.layout, sec.pg.world_size
    # torch.split, not slicing: its backward is one concatenation per tensor, where every
    # slice's backward would allocate and zero a whole tensor
    by_source = [torch.split(rows[sl.local_feature].values, counts[k])
                 for k, sl in enumerate(layout.slots_on[sec.pg.rank]) if sl.sharding_type is not _DP]
    send = [seg[s].reshape(-1) for s in range(W) for seg in by_source]
    in_splits = [sum(seg[s].numel() for seg in by_source) for s in range(W)]
    # what arrives: from each rank r, for each of its (not data-parallel) slots, the rows of this rank's ids
    senders = [sl for r in range(W) for sl in layout.slots_on[r] if sl.sharding_type is not _DP]
    sizes = [arrivals.count(sl) * sl.cols for sl in senders]
    out_splits = [sum(n for sl, n in zip(senders, sizes) if sl.rank == r) for r in range(W)]
    # nothing to send (no sharded slot here): the anchor's empty view, so that this rank's anchor gets a
    # gradient as every other rank's does (the loss scaler's agreement runs on it: neo/distributed/overflow.py)
    x = torch.cat(send) if send else sec.autograd_anchor.view(0)
    recv = all_to_all_pooled(x, out_splits, in_splits, sec.pg.world_comm, sec.comm, order,
                             name="sequence_all_to_all", consume=True).wait()
    pieces: Dict[str, Dict[Slot, torch.Tensor]] = defaultdict(dict)
    for sl, flat in zip(senders, _Unpack.apply(recv, sizes, sec.grad_scale)):
        pieces[sl.feature][sl] = flat.view(-1, sl.cols)
    return {f: arrivals.assemble(f, got) for f, got in pieces.items()}


def _data_parallel(sec: "ShardedEmbeddingCollection", rows: Dict[str, SequenceEmbedding],
                   counts: List[List[int]], order: BackwardOrder) -> Dict[str, torch.Tensor]:
    """Data-parallel features: this rank's own rows from its replica (no communication);
    backward: its gradient rows to every replica, which updates with all W ranks' (module doc)."""
    pg = sec.pg
    W, me = pg.world_size, pg.rank
    dp = [(k, sl) for k, sl in enumerate(sec.layout.slots_on[me]) if sl.sharding_type is _DP]
    by_source = [torch.split(rows[sl.local_feature].values, counts[k]) for k, sl in dp]
    # x: the DP slots' rows of all W * B samples, flattened source-major, slot order inside: the
    # order in which the backward AlltoAll delivers every source's gradient blocks
    x = torch.cat([seg[s].reshape(-1) for s in range(W) for seg in by_source])
    sizes = [sum(seg[s].numel() for seg in by_source) for s in range(W)]
    y = slice_local_varlen(x, sizes, pg.world_comm, sec.comm, order, name="sequence_data_parallel").wait()
    parts = _Unpack.apply(y, [counts[k][me] * sl.cols for k, sl in dp], sec.grad_scale)
    return {sl.feature: part.view(-1, sl.cols) for (_, sl), part in zip(dp, parts)}
