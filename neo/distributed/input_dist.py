"""Input distribution: send each feature's ids to the ranks that hold its shards.

Routing, per slot (one feature of one shard, see :mod:`neo.distributed.slots`):

- table_wise: all of the feature's ids to the owner;
- row_wise / table_row_wise: bucketized by row range, each id to the shard that holds
  its row, re-based to the shard (``id - row_offset``), all shards of a feature in one
  pass (:func:`bucketize_rows`);
- column_wise / table_column_wise: all ids duplicated to every column shard;
- data_parallel: all ids to every rank (each replica pools the global batch, so that its
  fused optimizer sees the global-batch gradient; see :mod:`.sharding.data_parallel`).

Two AlltoAll calls per batch, whatever the plan (three with ``validate``):

0. with ``validate`` (the default) and W > 1: the 6-int header alone to every rank,
   ``[B, has_weights, error, feature, id, sample]`` (``has_weights``: 0, 1, 2 for weights
   that require grad, 3 for weights read at lookup time from a ``weight_table``). It carries
   this rank's batch size and input-validation result, so that every rank learns of bad input
   on any rank (an id out of range, another batch size, weights on some ranks only) before the
   collectives whose sizes depend on it, and raises (naming the failing rank, feature, table,
   id, or the sizes) instead of hanging or of a transport's size error.
1. lengths: to every rank, the same header, then the B bag lengths of each of its slots (int64).
2. ids: the selected ids of each slot, followed by their per-id weights (fp32 bits) when
   the batch is weighted; int32 on the wire when every table has < 2^31 rows (half the
   bytes of int64; ids are validated, or clamped when validation is off), else int64.

Per-id weights that require grad (a learnable weighting computed on the source rank, such as
TorchRec's position-weighted features) travel apart from the ids, in a differentiable AlltoAll of
fp32 (:func:`~neo.distributed.comms.all_to_all_pooled`, launched with the ids): the shards' lookups
compute each received weight's gradient from the rows before their update
(``PooledLookup``), and its backward returns those gradients to the source ranks, where the
selections that routed them (slices, the row-wise bucketing) sum them into the batch's weights.
A column-split table's weight gets one partial gradient from each column shard; a
data-parallel table's from its own replica only (the others pool none of its bags). Every rank
must agree (the header's ``has_weights`` is 2 for such weights): the extra collective must run
on all or none.

Weights read at lookup time from a learnable table (:attr:`InputDist.weight_table`, e.g.
:class:`~neo.embedding.PositionWeights` in a training pipeline, which distributes batch i+1
before step i has updated the table): each id travels with its slot in the table
(``weight_table.table_index(batch)``, int32 in the weights' place of the ids AlltoAll); when the
shards' rank looks the batch up (the collection's ``compute``: :meth:`InputDist.weigh`), it
reads the table at those slots (``weight_table.read(slots)``); until then the local batch's
``weights`` hold the slots (int64, where weights are otherwise floating point). No collective of their own: the
table is a dense parameter, replicated, and its gradient, summed here over the ids each rank
holds (times W under ``average_gradients``, as the learnable weights' above), is averaged over
the ranks by DDP: the sum over every rank's ids of the global mean loss's gradient.

Invalid ids (outside ``[0, rows)`` of their table) with ``validate=False``: counted here, at the
source rank, once per id and per table (:attr:`InputDist.skipped_ids`), before any routing;
then sent as they are (row-split tables: dropped by the bucketizing, as no shard holds them;
the others: skipped by the lookup), so each contributes zero and updates nothing. Counting at
the source is what makes the counts reconcile under every sharding: a column-split table's ids
reach every column shard, a data-parallel table's every replica, a row-split table's invalid
ids no shard at all.

At world size 1, where every shard holds all of its table's rows, there is nothing to route: the
batch itself is the local batch (:attr:`InputDist.one_rank`).

Calling the input distribution runs (0) (a blocking exchange of 6 ints a rank), launches (1) and returns an :class:`Awaitable` of two
stages: ``progress()`` waits for the lengths and launches (2); ``wait()`` (running
``progress()`` first if nobody did) waits for the ids and regroups them. A training
pipeline calls ``progress()`` for batch i+1 in the middle of step i, so that the ids travel
under step i's compute.

On arrival a rank holds, for each of its slots, the bags of every rank's samples, source-
major; it regroups them into one :class:`~neo.sparse.KeyedJaggedBatch` of ``W * B``
samples (sample ``s * B + b`` is sample b of rank s), keys = its slots' local features.
Every rank must pass batches of the same size B with the same features: checked with
``validate`` (the header exchange, stage 0); without it a mismatch reaches the transport.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from neo.cpp import cpu_kernels
from neo.distributed.comms import Awaitable, all_to_all, all_to_all_pooled
from neo.distributed.process_groups import ProcessGroups
from neo.distributed.slots import Slot, SlotLayout
from neo.embedding.checks import EmbeddingInputError, count_bad_ids, count_bad_ids_to_int32
from neo.embedding.invalid_ids import InvalidIds
from neo.sparse import KeyedJaggedBatch

__all__ = ["InputDist", "DistributedBatch", "DistributedInputError"]

_HEADER = 6   # B, has_weights (0, 1, 2: require grad, 3: a weight_table's slots), error, feature index, id, sample
_MISSING_FEATURE = 2   # the header's error code of a feature absent from a rank's batch (1: an id out of range)
_OWN_WEIGHTS = 3       # a batch with weights of its own where the weights come from ``weight_table``


def _own_weights_message(rank: int) -> str:
    return (f"rank {rank}: the batch has per-id weights of its own, and the collection reads its weights from "
            f"its weight_table: drop one of the two")


class DistributedInputError(EmbeddingInputError):
    """Bad input on some rank; raised on every rank, naming the failing one."""


@dataclass
class DistributedBatch:
    """What a rank looks up after input distribution."""

    local: KeyedJaggedBatch
    """Keys: this rank's slot features (``feature#shard``), in slot order; ``W * B`` samples, source-major."""
    batch_size: int
    """B, samples per rank."""
    source_lengths: Dict[str, torch.Tensor]
    """(B,) bag lengths of this rank's own samples per feature (to divide row-split mean pooling)."""


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor if ctx.factor != 1.0 else grad, None


def bucketize_rows(values: torch.Tensor, bag_offsets: torch.Tensor, bounds: List[int],
                   weights: Optional[torch.Tensor] = None) -> List[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
    """One feature's ids by row shard: per shard s (rows ``bounds[s] .. bounds[s+1] - 1``), the
    (B,) bag lengths, its ids minus ``bounds[s]`` (bag order, order of occurrence) and their
    weights. Ids outside every shard are dropped (validated, or counted, at the source: see module doc).

    ``neo._C.bucketize_rows`` (two passes over the ids) when built and on CPU, else
    :func:`bucketize_rows_reference` (a mask per shard)."""
    if _C is None or values.device.type != "cpu":
        return bucketize_rows_reference(values, bag_offsets, bounds, weights)
    lens, out, sizes, pos = _C.bucketize_rows(values.contiguous(), bag_offsets.contiguous(),
                                             torch.tensor(bounds, dtype=torch.int64), weights is not None)
    n = sizes.tolist()
    ids = torch.split(out, n)
    ws = torch.split(weights[pos], n) if weights is not None else [None] * len(n)
    return list(zip(lens.unbind(0), ids, ws))


def bucketize_rows_reference(values: torch.Tensor, bag_offsets: torch.Tensor, bounds: List[int],
                             weights: Optional[torch.Tensor] = None):
    """Plain-torch :func:`bucketize_rows`: the reference."""
    out = []
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        m = (values >= r0) & (values < r1)
        cm = torch.zeros(values.numel() + 1, dtype=torch.int64, device=values.device)
        torch.cumsum(m, 0, out=cm[1:])
        lens = cm[bag_offsets[1:]] - cm[bag_offsets[:-1]]
        out.append((lens, values[m] - r0, None if weights is None else weights[m]))
    return out


_C = cpu_kernels("bucketize_rows")


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    if x.numel() > 1:
        torch.cumsum(x[:-1], 0, out=out[1:])
    return out


class InputDist:
    """Routes a rank's :class:`KeyedJaggedBatch` to the slots of every rank (see module doc)."""

    def __init__(self, layout: SlotLayout, pg: ProcessGroups, validate: bool = True,
                 weights_grad_factor: float = 1.0):
        self.layout, self.pg, self.validate = layout, pg, validate
        self.weight_table: Optional[Any] = None
        """Per-id weights read at lookup time from a learnable table, e.g.
        :class:`neo.embedding.PositionWeights`: an object with ``table_index(batch)`` ((N,) int64,
        each id's slot) and ``read(slots)`` (the weights there). The slots are routed with the ids; the
        weights are read when the lookup runs (:meth:`weigh`), not when the
        batch is distributed: a training pipeline distributes batch i+1 under step i, before step
        i updates the table (module doc). Every rank must set one (the header's ``has_weights``
        is 3); batches then carry no weights of their own."""
        self.weights_grad_factor = weights_grad_factor
        """Multiplies the gradient of learnable per-id weights on its way back to their source: the
        inverse of the collection's gradient scale (the shards' lookups see the gradient of the
        global mean loss, the source rank's weights take that of its own loss, as its dense part)."""
        self.W = pg.world_size
        self.rows = [layout.feature_table[f].num_rows for f in layout.features]
        self.wire = torch.int32 if max(self.rows) < 2 ** 31 else torch.int64      # dtype of ids on the wire
        # per row-split feature: its table's row-shard boundaries [r0, r1, ..., rows]
        self.row_bounds = {f: sorted({s.row_offset for s in layout.plan.tables[layout.feature_table[f].name].shards})
                           + [layout.feature_table[f].num_rows]
                           for f in layout.features
                           if layout.plan.tables[layout.feature_table[f].name].sharding_type.splits_rows}
        self.mean_row_split = [f for f in self.row_bounds if layout.feature_table[f].pooling.value == "mean"]
        # validate=False: invalid ids of this rank's batches, per feature (global feature order),
        # added up where the ids are (no wait for the device per batch; read only by skipped_ids)
        self._invalid = InvalidIds(layout.features, [layout.feature_table[f].name for f in layout.features],
                                   self.rows)
        slots = layout.slots_on[0] if self.W == 1 else []
        self.one_rank = self.W == 1 and all(s.full_rows for s in slots)
        """World size 1, every slot holding all of its table's rows: each slot's ids are its feature's
        as they are, so :meth:`__call__` hands the lookup the batch itself (:meth:`_one_rank_batch`:
        no collective, no copy where each feature has one slot; tested equal to the general path)."""
        self._fidx = {f: i for i, f in enumerate(layout.features)}                       # feature -> index
        self._slot_features = [self._fidx[s.feature] for s in slots]
        self._slot_per_feature = self._slot_features == list(range(len(layout.features)))
        self._slot_keys = tuple(s.local_feature for s in slots)

    @property
    def skipped_ids(self) -> Dict[str, int]:
        """Invalid ids of this rank's own batches since creation, per table (every table of the
        layout, by its name): what ``validate=False`` lets the lookups skip, each counted once
        however many shards the table has. Per rank: their sum over the ranks is the number of
        invalid ids in the global batches. All zero with ``validate=True`` (bad input raises)."""
        return self._invalid.per_table(t.name for t in self.layout.tables)

    def _count_skipped(self, values: torch.Tensor, offsets: torch.Tensor, B: int,
                       narrow: bool = False) -> Optional[torch.Tensor]:
        """Add the invalid ids of a batch (``values`` (N,) int64 in global feature order,
        ``offsets`` (F * B + 1,)) to the per-feature counts, on the ids' device. ``narrow``: also
        return the ids as int32, clamped to ``[-1, 2^31 - 1]`` (the same pass on the CPU)."""
        if not narrow:
            self._invalid.count(values, offsets, B)
            return None
        counts, narrowed = count_bad_ids_to_int32(values, offsets, B, self._invalid.on(values.device))
        self._invalid.add(counts)
        return narrowed

    # ---------------------------------------------------------------- source side
    def _bad_id_error(self, values: torch.Tensor, offsets: torch.Tensor, starts: List[int],
                      B: int) -> Optional[List[int]]:
        """The header's error fields ``[1, feature index, id, sample]`` of the first id outside its
        table (``values`` in global feature order, ``starts`` each feature's first id), or None.

        One pass over the batch's ids (:func:`count_bad_ids`) and one read of its F counts: per
        feature a min / max and two reads of them cost 2.5-4.5x the time on the CPU (8 to 26
        features, 8k to 532k ids, one thread, 2026-12-04) and, on a GPU, were 16 of the main job's
        22 device synchronisations a step (an H200, 2026-12-04). The position of the bad id is
        searched only where there is one."""
        counts = count_bad_ids(values, offsets, B, self._invalid.on(values.device)).tolist()
        f = next((f for f, n in enumerate(counts) if n), None)
        if f is None:
            return None
        rows, v = self.rows[f], values[starts[f]:starts[f + 1]]
        pos = int(((v < 0) | (v >= rows)).nonzero()[0])
        bag = int(torch.searchsorted(offsets, torch.tensor(starts[f] + pos, dtype=offsets.dtype, device=offsets.device),
                                     right=True)) - 1
        return [1, f, int(v[pos]), bag - f * B]

    def _message(self, rank: int, f: int, bad_id: int, sample: int) -> str:
        feat = self.layout.features[f]
        table = self.layout.feature_table[feat]
        return (f"rank {rank}: feature '{feat}' (table '{table.name}'): id {bad_id} at sample {sample} "
                f"is out of range [0, {table.num_rows})")

    def _missing_message(self, rank: int, f: int, count: int) -> str:
        feat = self.layout.features[f]
        more = f" and {count - 1} more" if count > 1 else ""
        return (f"rank {rank}: feature '{feat}' (table '{self.layout.feature_table[feat].name}'){more} not in its "
                f"batch (every rank passes every feature of the collection)")

    def __call__(self, batch: KeyedJaggedBatch, weigh: bool = True) -> Awaitable[DistributedBatch]:
        """Distribute ``batch`` (module doc); ``weigh=False``: without :attr:`weight_table`'s slots
        (unpooled lookups, which take no weights; every rank must pass the same)."""
        layout, W = self.layout, self.W
        missing = [k for k, f in enumerate(layout.features) if f not in batch.keys]
        missing_err = None
        if missing:
            if W == 1:
                raise DistributedInputError(self._missing_message(self.pg.rank, missing[0], len(missing)))
            # sent as empty bags with the error in the header (the header exchange, or the lengths
            # AlltoAll where ids are not validated): every rank raises, none waits for this one
            absent = [layout.features[k] for k in missing]
            batch = KeyedJaggedBatch(tuple(batch.keys) + tuple(absent), batch.values,
                                     torch.cat([batch.lengths, batch.lengths.new_zeros(len(absent) * batch.batch_size)]),
                                     batch.batch_size, weights=batch.weights)
            missing_err = [_MISSING_FEATURE, missing[0], len(missing), 0]
        batch = batch.permute(layout.features)                              # global feature order
        deferred = self.weight_table is not None and weigh
        own_weights = deferred and batch.weights is not None               # refused on every rank (header)
        if own_weights and W == 1:
            raise DistributedInputError(_own_weights_message(self.pg.rank))
        if deferred:     # each id's slot in the weights table travels in the weights' place
            slots = self.weight_table.table_index(batch)                     # (N,) int64
            batch = KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, batch.batch_size, weights=slots,
                                     offsets=batch.offsets, validate=False)
        # weights that require grad: sent apart from the ids, in a differentiable AlltoAll (module doc)
        learnable = batch.weights is not None and batch.weights.requires_grad and torch.is_grad_enabled()
        if self.one_rank:
            return Awaitable.ready(self._one_rank_batch(batch), "input_dist")
        B = batch.batch_size
        values = batch.values.to(torch.int64)
        offsets = batch.offsets.to(torch.int64)
        lengths = batch.lengths.to(torch.int64)
        weights = None if batch.weights is None else batch.weights.to(torch.int64 if deferred else torch.float32)
        starts = offsets[::B].tolist() if B else [0] * (len(layout.features) + 1)   # (F + 1,)
        header_err = [0, 0, 0, 0] if missing_err is None else missing_err
        if own_weights and missing_err is None:
            header_err = [_OWN_WEIGHTS, 0, 0, 0]
        if self.validate and values.numel() and header_err[0] == 0:
            header_err = self._bad_id_error(values, offsets, starts, B) or header_err
        narrowed = None                                                     # the int32 wire's ids, clamped
        if not self.validate:                                               # before routing drops or copies any
            narrowed = self._count_skipped(values, offsets, B, narrow=self.wire is torch.int32)
        has_weights = 3 if deferred else 0 if weights is None else 2 if learnable else 1
        head = torch.tensor([B, has_weights] + header_err, dtype=torch.int64, device=values.device)
        if self.validate and W > 1:
            # The headers alone first (6 ints to each rank): the lengths AlltoAll's sizes follow each
            # rank's B, and the ids' its weights, so ranks that disagree (a last partial batch on one
            # rank) must learn it before those, not in them (gloo aborts the process on mismatched
            # sizes). Bad ids on any rank are raised here too, on every rank.
            heads = all_to_all(head.repeat(W), [_HEADER] * W, [_HEADER] * W, self.pg.world_comm,
                               name="input_dist.header").wait().view(W, _HEADER)
            self._raise_on_bad_input(heads, B, has_weights)

        if self.wire is torch.int32:                                        # validated, or clamped to stay invalid
            values = values.to(torch.int32) if narrowed is None else narrowed
        fidx = self._fidx
        cache: Dict[tuple, tuple] = {}
        split: Dict[str, dict] = {}

        def select(slot: Slot):
            key = (slot.feature, slot.row_offset, slot.rows)
            if key in cache:
                return cache[key]
            f = fidx[slot.feature]
            lo, hi = starts[f], starts[f + 1]
            v = values[lo:hi]
            w = None if weights is None else weights[lo:hi]
            lens = lengths[f * B:(f + 1) * B]
            if not slot.full_rows:                                          # every row shard of f at once
                if slot.feature not in split:
                    bounds = self.row_bounds[slot.feature]
                    split[slot.feature] = dict(zip(bounds[:-1], bucketize_rows(
                        v, offsets[f * B:(f + 1) * B + 1] - lo, bounds, w)))
                lens, v, w = split[slot.feature][slot.row_offset]
            cache[key] = (lens, v, w)
            return cache[key]

        inline = weights is not None and not learnable                     # weights (fp32 bits, or slots) after the ids
        len_parts, id_parts, id_splits, w_parts, w_splits = [], [], [], [], []
        for d in range(W):
            sel = [select(s) for s in layout.slots_on[d]]
            len_parts.append(head)
            len_parts.extend(x[0] for x in sel)
            ids = [x[1] for x in sel]
            n = sum(int(i.numel()) for i in ids)
            id_parts.extend(ids)
            if inline:
                id_parts.extend((x[2] if deferred else x[2].view(torch.int32)).to(self.wire) for x in sel)
            elif learnable:
                w_parts.extend(x[2] for x in sel)
                w_splits.append(n)
            id_splits.append(n * (2 if inline else 1))
        send_lengths = torch.cat(len_parts)
        send_ids_buf = (torch.cat(id_parts) if id_parts else values[:0]).to(self.wire)
        # (N_sent, 1) fp32: every destination's weights in the order of its ids; their gradient comes back
        send_w = (torch.cat(w_parts) if w_parts else weights[:0]).view(-1, 1) if learnable else None
        K = len(layout.slots_on[self.pg.rank])
        len_in = [_HEADER + B * len(layout.slots_on[d]) for d in range(W)]
        len_out = [_HEADER + B * K] * W
        lengths_aw = all_to_all(send_lengths, len_out, len_in, self.pg.world_comm, name="input_dist.lengths")
        source_lengths = self._source_lengths(lengths, B)

        weighted = weights is not None
        stage: Dict[str, Any] = {}

        def send_ids() -> None:
            """Stage 2: the lengths have arrived; check them and launch the ids AlltoAll (and the
            learnable weights' own)."""
            recv = lengths_aw.wait().view(W, _HEADER + B * K)               # (W, header + K * B)
            heads = recv[:, :_HEADER]
            self._raise_on_bad_input(heads, B, has_weights)
            lens = recv[:, _HEADER:].reshape(W, K, B)                       # (W, K, B) source-major
            sizes = lens.sum(-1)                                            # (W, K) ids per (source, slot)
            per_source = sizes.sum(-1)                                      # (W,)
            out_splits = (per_source * (2 if inline else 1)).tolist()
            stage.update(lens=lens, sizes=sizes, per_source=per_source,
                         ids_aw=all_to_all(send_ids_buf, out_splits, id_splits, self.pg.world_comm, name="input_dist.ids"))
            if learnable:       # backward: the AlltoAll back, each shard's gradients to their source
                stage["weights_aw"] = all_to_all_pooled(send_w, per_source.tolist(), w_splits, self.pg.world_comm,
                                                        name="input_dist.weights")

        def finish() -> DistributedBatch:
            lens, sizes, per_source = stage["lens"], stage["sizes"], stage["per_source"]
            buf = stage.pop("ids_aw").wait()
            # regroup (source, slot) segments into (slot, source) order: feature-major jagged layout;
            # segments are contiguous, so this is K * W slice copies
            src_base = _exclusive_cumsum(per_source * (2 if inline else 1))             # (W,)
            old_start = (src_base.unsqueeze(1) + (sizes.cumsum(1) - sizes)).tolist()    # (W, K)
            size_l, n_src = sizes.tolist(), per_source.tolist()
            order = [(s, k) for k in range(K) for s in range(W)]
            if W == 1 and not weighted:
                local_values = buf
            else:
                local_values = torch.cat([buf[old_start[s][k]:old_start[s][k] + size_l[s][k]] for s, k in order]) \
                    if order else buf[:0]
            local_weights = None
            if inline:                                                                  # weights follow the ids
                pieces = [buf[old_start[s][k] + n_src[s]:old_start[s][k] + n_src[s] + size_l[s][k]] for s, k in order]
                got = (torch.cat(pieces) if pieces else buf[:0])
                local_weights = got.to(torch.int64) if deferred else got.to(torch.int32).view(torch.float32)
            elif learnable:     # (N_recv,) in the ids' (source, slot) layout, regrouped alike (differentiable)
                got = _ScaleGrad.apply(stage.pop("weights_aw").wait().view(-1), self.weights_grad_factor)
                pieces = [got[old_start[s][k]:old_start[s][k] + size_l[s][k]] for s, k in order]
                local_weights = torch.cat(pieces) if pieces else got[:0]
            local_lengths = lens.permute(1, 0, 2).reshape(-1)                            # (K * W * B,)
            keys = tuple(s.local_feature for s in self.layout.slots_on[self.pg.rank])
            local = KeyedJaggedBatch(keys, local_values, local_lengths, W * B, weights=local_weights, validate=False)
            return DistributedBatch(local, B, source_lengths)

        return Awaitable(finish, "input_dist", progress=send_ids)

    def _one_rank_batch(self, batch: KeyedJaggedBatch) -> DistributedBatch:
        """The local batch at world size 1 (:attr:`one_rank`), ``batch`` in global feature order: the
        same ids, lengths and weights each slot would receive through the general path, the same
        error for a bad id (validate) or the same counts (validate=False: the lookup skips them)."""
        B, F = batch.batch_size, len(self.layout.features)
        weights = batch.weights                                            # fp32, or slots of weight_table
        if weights is not None and weights.dtype != torch.int64:
            weights = weights.to(torch.float32)
        starts = batch.offsets[::B].tolist() if B else [0] * (F + 1)     # (F + 1,): each feature's first id
        if batch.values.numel():
            if self.validate:
                err = self._bad_id_error(batch.values, batch.offsets, starts, B)
                if err is not None:
                    self._raise_on_bad_input(torch.tensor([[B, int(weights is not None)] + err]), B,
                                             int(weights is not None))
            else:
                self._count_skipped(batch.values.to(torch.int64), batch.offsets.to(torch.int64), B)
        if self._slot_per_feature:                                         # one slot per feature, in order
            local = KeyedJaggedBatch(self._slot_keys, batch.values, batch.lengths, B, weights=weights,
                                     offsets=batch.offsets, validate=False)
        else:                                                              # column shards side by side
            values = torch.cat([batch.values[starts[f]:starts[f + 1]] for f in self._slot_features])
            lengths = torch.cat([batch.lengths[f * B:(f + 1) * B] for f in self._slot_features])
            local_w = None if weights is None else \
                torch.cat([weights[starts[f]:starts[f + 1]] for f in self._slot_features])
            local = KeyedJaggedBatch(self._slot_keys, values, lengths, B, weights=local_w, validate=False)
        return DistributedBatch(local, B, self._source_lengths(batch.lengths, B))

    def weigh(self, local: KeyedJaggedBatch) -> KeyedJaggedBatch:
        """``local`` (a distributed batch's) with its weights read from :attr:`weight_table` where
        they are its slots (int64, module doc), else itself. Their gradient goes to the table
        times :attr:`weights_grad_factor`. The collection's ``compute`` calls it, as the lookup runs."""
        slots = local.weights
        if slots is None or slots.dtype != torch.int64 or self.weight_table is None:
            return local
        weights = _ScaleGrad.apply(self.weight_table.read(slots).to(torch.float32), self.weights_grad_factor)
        return KeyedJaggedBatch(local.keys, local.values, local.lengths, local.batch_size, weights=weights,
                                offsets=local.offsets, validate=False)

    def _source_lengths(self, lengths: torch.Tensor, B: int) -> Dict[str, torch.Tensor]:
        """(B,) bag lengths of each mean-pooled row-split feature (``lengths`` in global feature order)."""
        return {f: lengths[self._fidx[f] * B:(self._fidx[f] + 1) * B] for f in self.mean_row_split}

    # ---------------------------------------------------------------- agreement
    def _raise_on_bad_input(self, heads: torch.Tensor, B: int, has_weights: int) -> None:
        """Raise on every rank where any rank's header (``heads`` (W, 6)) reports bad input, or
        where the ranks disagree on the batch size or on ``has_weights`` (this rank's: 0, 1, 2)."""
        me = self.pg.rank
        failed = [r for r in range(self.W) if int(heads[r, 2])]
        if failed:
            msgs = [self._missing_message(r, int(heads[r, 3]), int(heads[r, 4]))
                    if int(heads[r, 2]) == _MISSING_FEATURE else
                    _own_weights_message(r) if int(heads[r, 2]) == _OWN_WEIGHTS else
                    self._message(r, int(heads[r, 3]), int(heads[r, 4]), int(heads[r, 5])) for r in failed]
            who = "this rank" if me in failed else f"rank(s) {failed}"
            raise DistributedInputError(
                f"input distribution stopped on rank {me}: bad input on {who}: " + "; ".join(msgs))
        sizes = heads[:, 0].tolist()
        if any(s != B for s in sizes):
            raise DistributedInputError(f"rank {me}: every rank must pass the same batch size; got {sizes} per rank "
                                        "(a last partial batch on some ranks? drop it, as drop_last does, or pad it)")
        ws = heads[:, 1].tolist()
        if any((w == 3) != (has_weights == 3) for w in ws):
            raise DistributedInputError(
                f"rank {me}: weight_table is set on rank(s) {[r for r, w in enumerate(ws) if w == 3]} and not on the "
                f"others: set it on every rank alike (each id travels with its slot in the table)")
        if any(bool(w) != bool(has_weights) for w in ws):
            raise DistributedInputError(f"rank {me}: some ranks pass per-id weights and some do not: {ws}")
        if any(w != has_weights for w in ws):
            learn = [r for r, w in enumerate(ws) if w == 2]
            raise DistributedInputError(
                f"rank {me}: the per-id weights require grad on rank(s) {learn} and not on the others: their "
                f"gradient comes back in a collective of its own, which every rank must join. Make them require "
                f"grad on every rank (under torch.is_grad_enabled()), or on none (detach them)")
