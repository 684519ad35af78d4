"""ShardedEmbeddingCollection: embedding tables sharded by a 4D plan, trained across ranks.

A batch's path (rank r, B local samples, W ranks)::

    batch (B samples, every feature)
      -> input_dist(batch)        two AlltoAlls (lengths + header, ids [+ weights]): each slot
                                  (feature x shard) receives its ids from all W ranks
      -> compute(dist_batch)      ONE TableBatchedEmbedding with all of this rank's shards pools
                                  (W * B, local columns), samples source-major
      -> output_dist(pooled)      per sharding type: AlltoAll (table/column-wise), ReduceScatter
                                  (row-wise), intra-node then cross-node (table_row_wise,
                                  table_column_wise), local slice (data-parallel); on one
                                  host, every type in ONE AlltoAll (sharding/one_host.py)
      -> (B, sum D)               features in table order, as TableBatchedEmbedding(tables)(batch)

Backward runs the reverse collectives (autograd Functions in :mod:`.comms`) and each
shard's fused optimizer updates it in place.

Gradient scale (``average_gradients=True``, the default). Each rank's loss is the MEAN
over its B samples and DistributedDataParallel AVERAGES dense gradients across ranks: that
is single-process training with the mean over the global batch of W * B samples. The
embedding gradient arriving at a shard from rank s is d(mean_s)/d(pooled) = W x
d(global mean)/d(pooled), so the collection multiplies the gradient of its output by 1 / W
before it is sent back: every fused update then equals the unsharded one. With
``average_gradients=False`` the gradients are summed (for a loss that is a SUM over the
global batch, with DDP gradients scaled to match).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from neo.config.embedding import TableConfig
from neo.distributed.assemble import Assemble, column_runs, split_runs
from neo.distributed.comms import Awaitable, BackwardOrder, CommConfig, CommPrecision
from neo.distributed.input_dist import DistributedBatch, InputDist
from neo.distributed.overflow import OverflowConsensus
from neo.distributed.plan_view import PlanError, PlanView, ShardingType
from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharding.data_parallel import DataParallelOutputDist
from neo.distributed.sharding.hierarchical import TableColumnWiseOutputDist, TableRowWiseOutputDist
from neo.distributed.sharding.one_host import OneHostOutputDist
from neo.distributed.sharding.row_wise import RowWiseOutputDist
from neo.distributed.sharding.table_wise import AllToAllOutputDist
from neo.distributed.sharded_rates import ShardRates
from neo.distributed.sharded_weights import ShardWeights
from neo.distributed.slots import SlotLayout
from neo.distributed.state_dict import LoadRecord, drop_local_keys, load_tables, save_tables
from neo.embedding import TableBatchedEmbedding
from neo.embedding.anchor import ANCHOR, new_anchor, share_anchor
from neo.embedding.layout import group_tables
from neo.embedding.transforms import lookup_method
from neo.embedding.variable_batch import own_bags, take_rows
from neo.models.interaction import PooledPieces
from neo.keyed_embeddings import KeyedEmbeddings
from neo.sparse import KeyedJaggedBatch, as_batch, is_variable_batch, padded_variable_batch, variable_batch_parts

if TYPE_CHECKING:
    from neo.embedding.sequence import SequenceEmbedding

__all__ = ["ShardedEmbeddingCollection"]


def _drop_local_entries(module: "ShardedEmbeddingCollection", state_dict, prefix: str, local_metadata) -> None:
    """State-dict post hook: the tables are saved by name (``_save_to_state_dict``), not as the
    local module's rank-local shards."""
    mine = [k for k in state_dict if k.startswith(prefix)]
    keep = set(drop_local_keys(module, mine, prefix))
    for key in mine:
        if key not in keep:
            del state_dict[key]


def _after_load(module: "ShardedEmbeddingCollection", incompatible) -> None:
    """Load post hook: the local module's shard keys are not missing (the tables were loaded by
    name), unless the state dict held those rank-local keys."""
    record, module._loading = module._loading, None
    if record is not None and not record.rank_local:
        incompatible.missing_keys[:] = drop_local_keys(module, incompatible.missing_keys, record.prefix)


class ShardedEmbeddingCollection(ShardWeights, ShardRates, nn.Module):
    """Embedding tables sharded across ranks by a plan; see the module docstring.

    Args:
        tables: the model's tables (same configs as the unsharded TableBatchedEmbedding).
        plan: the planner's plan (dict, JSON, object with to_dict/to_json, or PlanView).
        pg: this rank's :class:`ProcessGroups`; the plan's world and local sizes must match it.
        backend: embedding backend of the local module ("auto", "reference", "cpu", ...).
        comm: wire precision of pooled embeddings, forward and backward.
        validate: check ids at the source before any collective; bad input raises on every
            rank (naming rank, feature, table and id) instead of hanging. ``validate=False``:
            invalid ids are skipped (zero rows, no update) and counted at the source, per
            table (:attr:`skipped_ids`).
        average_gradients: divide embedding gradients by W (mean-loss semantics; see module doc).
        seed: seed of the tables' initial weights: each shard starts at its rows and columns of
            the table the unsharded module draws with this seed (:mod:`neo.embedding.init`), so
            the initial model is the same under any plan and world size (data-parallel replicas
            are broadcast from rank 0 besides). Stochastic rounding takes ``seed + rank``.
        store_dir: directory of the backing files of cached shards (``placement: cached`` on an
            mmap store); see :mod:`neo.embedding.cache`.
        fuse_output_dists: with every rank on one host and shards on the CPU, carry every sharding
            type's pooled output in one AlltoAll per direction
            (:class:`~neo.distributed.sharding.one_host.OneHostOutputDist`; the same result bit for
            bit); False: one output distribution per type, as across hosts.

    State dict (TorchRec's way, :mod:`neo.distributed.state_dict`): ``state_dict()`` has the
    unsharded :class:`~neo.embedding.TableBatchedEmbedding`'s keys, ``<table>.weight``,
    ``<table>.<state>`` (``sum``, ``exp_avg``, ...) and ``<table>.step``; a sharded table's
    values are ShardedTensors of its global shape whose local shards are views of this rank's
    live shards, a data-parallel table's are its replica. So ``dcp.save(sd)`` then, under any
    plan or world size, ``sd = model.state_dict(); dcp.load(sd, ...); model.load_state_dict(sd)``
    restores the tables bit for bit (``dcp.load`` writes into the live shards), and an unsharded
    module's state dict of full tensors loads too (each rank copies its shards' slices).
    Row-wise Adagrad's per-row state of a table split by columns is kept per column band,
    ``<table>.sum@<c0>:<c1>``, and loads into the same bands only (an error naming the table
    otherwise). Cached tables' values are their backing stores, written back when the state
    dict is taken: take it right before ``dcp.save`` / ``dcp.load``. Creating the state dict
    is local (no collective); ``<table>.step`` is only on the ranks that hold a shard of the table.
    """

    _grad_scaler: Optional[torch.amp.GradScaler] = None
    overflow_consensus: Optional[OverflowConsensus] = None
    """Where a scaler is set on more than one rank: the ranks' agreement on overflows
    (:mod:`neo.distributed.overflow`; ``agreed``: the backwards in which some rank skipped)."""

    def __init__(self, tables: Sequence[TableConfig], plan: Any, pg: ProcessGroups, backend: str = "auto",
                 comm: CommConfig = CommConfig(), validate: bool = True, average_gradients: bool = True,
                 seed: int = 0, device: Optional[torch.device | str] = None, store_dir: Optional[str] = None,
                 fuse_output_dists: bool = True):
        super().__init__()
        if device is not None and torch.device(device).type == "meta":
            raise ValueError("ShardedEmbeddingCollection: device='meta' is not a place for shards: it allocates "
                             "this rank's shards only, so give it the device they live on (build the unsharded "
                             "TableBatchedEmbedding on 'meta' instead, and parallelize replaces it)")
        self.tables = list(tables)
        self.plan = PlanView.from_plan(plan, self.tables)
        if (self.plan.world_size, self.plan.local_world_size) != (pg.world_size, pg.local_world_size):
            raise PlanError(f"plan is for world_size {self.plan.world_size} / local_world_size "
                            f"{self.plan.local_world_size}, but the process groups have {pg.world_size} / "
                            f"{pg.local_world_size}")
        self.pg, self.comm = pg, comm
        self.layout = SlotLayout(self.tables, self.plan)
        self.grad_scale = 1.0 / pg.world_size if average_gradients else 1.0
        shard_tables = self.layout.shard_tables_on[pg.rank]
        self.autograd_anchor = new_anchor(device)
        """The collection's one parameter, shared with its local module (``TableBatchedEmbedding.autograd_anchor``):
        one flag, :attr:`frozen`, on every rank, whatever shards it holds. Not in the state dict."""
        self.lookup: Optional[TableBatchedEmbedding] = None
        if shard_tables:
            # every id was checked (validate) or counted (validate=False) at its source rank, by
            # InputDist: counted again here, a column-split or data-parallel table's ids would count
            # once per shard or replica, and a row-split table's invalid ids (sent to no shard) not at all
            self.lookup = TableBatchedEmbedding(shard_tables, backend=backend, device=device, validate=False,
                                                seed=seed, store_dir=store_dir, count_skipped=False,
                                                regions=self.layout.regions_on[pg.rank], rounding_seed=seed + pg.rank)
            share_anchor(self.lookup, self.autograd_anchor)
            # several ranks: a rank's overflow must not lower its scale alone; the ranks agree (overflow.py)
            self.lookup.reports_overflow = pg.world_size == 1
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._fuse_output_dists = fuse_output_dists
        self._local_dim = sum(s.cols for s in self.layout.slots_on[pg.rank])
        self._input_dist = InputDist(self.layout, pg, validate=validate,
                                     weights_grad_factor=float(pg.world_size) if average_gradients else 1.0)
        self.output_dists = self._build_output_dists()
        order = [c for od in self.output_dists for c in od.global_columns]
        assert sorted(order) == list(range(self.layout.output_dim)), "output columns must tile the output"
        self._blocks = column_runs(enumerate(order))                             # cat[:, s:s+n] -> out[:, g:g+n]
        self._local_widths = [od.local_width for od in self.output_dists]
        self._one_rank = (pg.world_size == 1 and comm.forward == comm.backward == CommPrecision.FP32
                          and not any(getattr(getattr(od, "divide", None), "spans", None) for od in self.output_dists))
        """World size 1 with fp32 on the wire and no mean-pooled row-wise table (whose output
        distribution divides its sums by the bag lengths): every type's pooled output is then this
        rank's own, in the order the output distributions would deliver it, so :meth:`output_dist`
        assembles the output straight from the lookup's (no per-type distribution, no copies into
        wire buffers; tested equal to them bit for bit)."""
        self._block_cache: Dict[tuple, dict] = {}
        self._after_output: List[Callable[[], None]] = []
        self._places_cache: Dict[tuple, Optional[Tuple[torch.Tensor, torch.Tensor]]] = {}
        self._dp_bag_cache: Dict[tuple, Optional[torch.Tensor]] = {}
        self.timers: Optional[Callable[[str], Any]] = None
        """Set by the trainer: the backward collectives and the fused update are timed into it."""
        assert sum(self._local_widths) == self._local_dim
        self._loading: Optional[LoadRecord] = None
        groups = group_tables(self.tables)
        self._lr_groups = [[t.name for t in ts] for ts in groups]
        """The global tables that share a fused update and its learning rate (one optimizer config and dtype)."""
        self._group_lrs = [ts[0].optimizer.lr for ts in groups]
        self.register_state_dict_post_hook(_drop_local_entries)
        self.register_load_state_dict_post_hook(_after_load)
        self._broadcast_replicas()

    def _build_output_dists(self) -> List[Any]:
        types = set(self.plan.types())
        if (self._fuse_output_dists and len({t.output_group for t in types}) > 1 and self.pg.world_size > 1
                and self.pg.num_nodes == 1 and self.device.type == "cpu"):
            return [OneHostOutputDist(self.layout, self.pg, self.comm)]
        T = ShardingType
        dists: List[Any] = []
        a2a = tuple(t for t in (T.TABLE_WISE, T.COLUMN_WISE) if t in types)
        if a2a:  # table_wise and column_wise share one AlltoAll
            dists.append(AllToAllOutputDist(self.layout, self.pg, a2a, self.comm,
                                            name="_".join(t.value for t in a2a)))
        if T.ROW_WISE in types:
            dists.append(RowWiseOutputDist(self.layout, self.pg, self.comm))
        if T.TABLE_ROW_WISE in types:
            dists.append(TableRowWiseOutputDist(self.layout, self.pg, self.comm))
        if T.TABLE_COLUMN_WISE in types:
            dists.append(TableColumnWiseOutputDist(self.layout, self.pg, self.comm))
        if T.DATA_PARALLEL in types:
            dists.append(DataParallelOutputDist(self.layout, self.pg, self.comm))
        return dists

    # ------------------------------------------------------------------ the three stages
    def input_dist(self, batch: KeyedJaggedBatch, weigh: bool = True) -> Awaitable[DistributedBatch]:
        """Launch the lengths AlltoAll now; ``wait()`` sends the ids and builds the local batch.
        ``batch``: a KeyedJaggedBatch or a ``torchrec.KeyedJaggedTensor`` (:func:`neo.sparse.as_batch`);
        ``weigh=False``: without the :attr:`weight_table`'s slots (unpooled lookups take no weights)."""
        return self._input_dist(as_batch(batch), weigh=weigh)

    def compute(self, batch: DistributedBatch) -> torch.Tensor:
        """Pool this rank's shards for all W * B samples: (W * B, local columns), slot order.

        Data-parallel slots pool only this rank's own B samples (the other rows are zeros,
        which their output distribution drops); their fused update still covers all W * B."""
        local = self._input_dist.weigh(batch.local)   # a weight_table's weights, read now
        if self.lookup is None:     # (W * B, 0), on the anchor where it trains: a gradient as on the other ranks
            out = self.autograd_anchor.view(1, 0)
            w = local.weights
            if w is not None and w.requires_grad:   # (0,) received: in the graph all the same, so that this
                out = out + w[:0].view(1, 0)         # rank joins the weights' AlltoAll back (input_dist), and
                                                     # a weight_table gets its (zero) gradient, as DDP expects
            return out.expand(local.batch_size, 0).to(local.values.device)
        return self.lookup(local, pooled_bags=self._dp_bags(batch))

    def _dp_bags(self, batch: DistributedBatch) -> Optional[torch.Tensor]:
        """(F_local * W * B,) bool: every bag, but a data-parallel slot's other ranks' samples; None
        without data-parallel slots (or in one process)."""
        W, B = self.pg.world_size, batch.batch_size
        key = (W, B)
        if key not in self._dp_bag_cache:
            slots = self.layout.slots_on[self.pg.rank]
            mask = None
            if W > 1 and any(s.sharding_type is ShardingType.DATA_PARALLEL for s in slots):
                mask = torch.ones(len(slots), W, B, dtype=torch.bool)
                for i, s in enumerate(slots):
                    if s.sharding_type is ShardingType.DATA_PARALLEL:
                        mask[i] = False
                        mask[i, self.pg.rank] = True
                mask = mask.reshape(-1).to(self.device)
            self._dp_bag_cache[key] = mask
        return self._dp_bag_cache[key]

    def prefetch(self, batch: DistributedBatch, future: Sequence[DistributedBatch] = ()) -> None:
        """Start making this rank's cached rows of ``batch`` resident (on the cache's worker
        thread), for the step that will :meth:`compute` it; ``future``: the batches after it, for
        the lookahead policy. No-op without cached shards. See :mod:`neo.embedding.cache`."""
        if self.lookup is not None and self.lookup.has_cache:
            self.lookup.prefetch(batch.local, [b.local for b in future])

    def flush_cache(self) -> int:
        """Write back every dirty cached row of this rank's shards; returns the rows written."""
        return 0 if self.lookup is None else self.lookup.flush_cache()

    def cache_stats(self, settled: bool = False) -> Dict[str, Any]:
        """Counters of this rank's cached shards, keyed by shard table (``name#k``); ``settled``:
        once the prefetches in flight have finished."""
        return {} if self.lookup is None else self.lookup.cache_stats(settled)

    def run_after_output(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once, right after the next :meth:`output_dist`'s collectives have arrived.

        The training pipeline hands it the next batch's ``input_dist(...).progress``: by then
        that batch's lengths have long arrived (no wait), and its ids travel under this step's
        interaction, top MLP and backward. Collective order stays the same on every rank
        (every rank registers the same callbacks at the same points)."""
        self._after_output.append(fn)

    def output_dist(self, pooled: torch.Tensor, batch: DistributedBatch,
                    pieces: bool = False) -> Awaitable[Union[torch.Tensor, PooledPieces]]:
        """Launch every sharding type's first collective now; ``wait()`` returns (B, sum D).

        ``pooled`` (what :meth:`compute` returned) is consumed: an AlltoAll may receive into its
        memory (``comms.all_to_all_pooled(consume=True)``), so it must not be read afterwards.

        ``pieces=True``: where the layout allows (one output distribution, each feature's
        columns contiguous in one piece, all features of one dimension), ``wait()`` returns
        :class:`~neo.models.PooledPieces` over the received buffer instead, so that a consumer
        such as the fused dot interaction reads it in place (no assembling copy forward, no
        scatter-and-scale pass backward); ``PooledPieces.tensor()`` still assembles."""
        if self._one_rank:          # every type's received piece: its columns of `pooled`, in order
            local = [(pooled.contiguous().reshape(-1), [pooled.shape[1]])]
            launched = []
        else:
            local = None
            order = BackwardOrder(self.timers)
            # each output distribution's columns are contiguous in `pooled` (slots sorted by OUTPUT_GROUP)
            xs = [pooled] if len(self.output_dists) == 1 else torch.split(pooled, self._local_widths, dim=1)
            launched = [od(x, batch, order) for od, x in zip(self.output_dists, xs)]

        def assemble() -> torch.Tensor:
            received = local if local is not None else [a.wait() for a in launched]   # in a fixed order
            hooks, self._after_output = self._after_output, []
            for fn in hooks:                                 # e.g. the next batch's ids AlltoAll
                fn()
            flats = [p[0] for p in received]
            widths = tuple(tuple(p[1]) for p in received)
            blocks = self._block_cache.get(widths)
            if blocks is None:
                blocks = self._block_cache[widths] = split_runs(self._blocks, widths)
            full = lambda: Assemble.apply(batch.batch_size, self.layout.output_dim, blocks, self.grad_scale, *flats)
            where = self._feature_places(widths, blocks, batch.batch_size) if pieces else None
            if where is None:
                return full()
            return PooledPieces(flats[0], *where, self.grad_scale, tensor=full)

        return Awaitable(assemble, "output_dist")

    def _feature_places(self, widths: tuple, blocks: dict, B: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(offsets, strides) of every output feature in the single received flat, or None."""
        key = (widths, B)
        if key in self._places_cache:
            return self._places_cache[key]
        dims = {self.layout.feature_table[f].dim for f in self.layout.features}
        places = None
        if len(blocks["widths"]) == 1 and len(dims) == 1:
            D, widths = dims.pop(), blocks["widths"][0]
            piece_off = [B * sum(widths[:p]) for p in range(len(widths))]
            col = {}                                                 # output column -> (piece, column)
            for _, pi, s, t, n in blocks["blocks"]:
                for j in range(n):
                    col[t + j] = (pi, s + j)
            offsets, strides = [], []
            for f in self.layout.features:
                c0 = self.layout.feature_offset[f]
                pi, s0 = col[c0]
                if any(col[c0 + d] != (pi, s0 + d) for d in range(D)):
                    break                                            # split across pieces (column-wise)
                offsets.append(piece_off[pi] + s0)
                strides.append(widths[pi])
            else:
                places = (torch.tensor(offsets, dtype=torch.int64), torch.tensor(strides, dtype=torch.int64))
        self._places_cache[key] = places
        return places

    # ------------------------------------------------------------------ the lookups and their output
    @lookup_method
    def forward(self, batch: KeyedJaggedBatch) -> torch.Tensor:
        """Pooled embeddings (B, sum D) of this rank's samples, features in table order. A
        variable-batch ``torchrec.KeyedJaggedTensor`` (VBE): its distinct bags are sent and pooled
        (:meth:`_padded_variable_batch`), then each sample's row taken (``take_rows``). Under
        torch.func's transforms the lookup is a constant of the function, as the unsharded
        module's (:mod:`neo.embedding.transforms`; collective all the same)."""
        if torch.compiler.is_exporting():
            raise NotImplementedError(
                "torch.export of a ShardedEmbeddingCollection: an exported program runs in one process; copy the "
                "tables (full_weights()) into an unsharded TableBatchedEmbedding (table_weight(name).copy_(w)) "
                "and export the model with that (neo.export)")
        if is_variable_batch(batch):
            padded, inverse = self._padded_variable_batch(batch)
            pooled = self(padded)
            slices = self.feature_slices()
            return take_rows(pooled, list(slices.values()), [inverse[f] for f in slices])
        dist_batch = self.input_dist(batch).wait()
        return self.output_dist(self.compute(dist_batch), dist_batch).wait()

    def _padded_variable_batch(self, kjt):
        """The variable batch's distinct bags padded to a batch size every rank agrees on (the
        largest of any rank's B and B_f: one small AllReduce) and its inverse indices
        (:func:`neo.sparse.padded_variable_batch`). Collective."""
        parts = variable_batch_parts(kjt)
        size = torch.tensor([max([parts.batch_size, *parts.strides])], dtype=torch.int64)
        if self.pg.world_size > 1:
            dist.all_reduce(size, op=dist.ReduceOp.MAX, group=self.pg.world)
        return padded_variable_batch(kjt, validate=self._input_dist.validate, pad_to=int(size), parts=parts)

    @lookup_method
    def sequence(self, batch: KeyedJaggedBatch) -> Dict[str, "SequenceEmbedding"]:
        """Unpooled lookup of this rank's samples: ``{feature: SequenceEmbedding(values (N, D),
        lengths (B,))}``, one row per id, under the same plan and fused updates as the pooled
        lookup (TorchRec's sharded ``EmbeddingCollection``); see :mod:`neo.distributed.sequence`.
        Collective: every rank calls it with a batch of the same size."""
        from neo.distributed.sequence import sharded_sequence_lookup

        if is_variable_batch(batch):               # each feature's own B_f bags, as TorchRec's EC returns
            padded, _ = self._padded_variable_batch(batch)
            return own_bags(sharded_sequence_lookup(self, padded), batch)
        return sharded_sequence_lookup(self, as_batch(batch))

    @property
    def output_dim(self) -> int:
        return self.layout.output_dim

    def feature_slices(self) -> Dict[str, slice]:
        """Each feature's columns in :meth:`forward`'s ``(B, sum of D)`` output: features in table
        order, as the unsharded module's (whatever the plan), e.g. ``{"user": slice(0, 16), ...}``."""
        lay = self.layout
        return {f: slice(lay.feature_offset[f], lay.feature_offset[f] + lay.feature_table[f].dim)
                for f in lay.features}

    def keyed(self, batch: KeyedJaggedBatch) -> KeyedEmbeddings:
        """:meth:`forward`'s output keyed by feature (TorchRec's ``KeyedTensor``); see
        :class:`neo.sparse.KeyedEmbeddings`. Collective, as :meth:`forward`."""
        return KeyedEmbeddings.of(self, self(batch))

    # ------------------------------------------------------------------ settings and counts
    @property
    def weight_table(self) -> Optional[Any]:
        """A learnable table of per-id weights read at lookup time, e.g. a
        :class:`neo.embedding.PositionWeights` (``table_index(batch)``: each id's slot;
        ``read(slots)``: the weights there), or None. Set, each id travels with its slot and its weight is
        read from the table when :meth:`compute` runs, so that a training pipeline, which
        distributes batch i+1 under step i, weighs it with the table step i updated. The table's
        gradient is summed over the ids this rank holds, times W under ``average_gradients``, for
        DDP to average (:mod:`neo.distributed.input_dist`). Set it alike on every rank; batches
        then carry no weights of their own. Unpooled lookups (:meth:`sequence`) take no weights:
        their ids travel without slots."""
        return self._input_dist.weight_table

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "weight_table":    # not a submodule where it is one (PositionWeights): its owner trains it
            self._input_dist.weight_table = value
            return
        super().__setattr__(name, value)

    @property
    def skipped_ids(self) -> Dict[str, int]:
        """Invalid ids (outside ``[0, rows)`` of their table) in the batches THIS RANK passed
        since creation, per table by its name (pooled and :meth:`sequence` lookups alike). With
        ``validate=False`` the lookups skip them (zero rows, no update); each is counted once, at
        its source rank, whatever the table's sharding, so the sum over the ranks is the number
        of invalid ids in the global batches. All zero with ``validate=True`` (bad input raises).
        Local: no collective (sum it with an AllReduce for the global count)."""
        return self._input_dist.skipped_ids

    @property
    def grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        """The ``torch.amp.GradScaler`` that scales the loss, if any: this rank's fused updates
        divide their gradients by its scale and skip an overflowed step, and an overflow on any
        rank lowers the scale on every rank (:mod:`neo.distributed.overflow`). Set it on every
        rank alike (:mod:`neo.embedding.loss_scale`)."""
        return self._grad_scaler

    @grad_scaler.setter
    def grad_scaler(self, scaler: Optional[torch.amp.GradScaler]) -> None:
        self._grad_scaler = scaler
        if self.lookup is not None:
            self.lookup.grad_scaler = scaler
        if self.overflow_consensus is not None:
            self.overflow_consensus.detach()
        self.overflow_consensus = OverflowConsensus(self) if scaler is not None and self.pg.world_size > 1 else None

    @property
    def frozen(self) -> bool:
        """The tables frozen (``requires_grad_(False)`` on this collection or a parent; see
        ``TableBatchedEmbedding.frozen``): lookups as in evaluation. Set it on every rank alike."""
        return not self.autograd_anchor.requires_grad

    @frozen.setter
    def frozen(self, value: bool) -> None:
        self.autograd_anchor.requires_grad_(not value)

    @property
    def skipped_updates(self) -> int:
        """This rank's fused updates skipped for an overflowed loss scale (local, no collective)."""
        return 0 if self.lookup is None else self.lookup.skipped_updates

    # ------------------------------------------------------------------ state dict, by table
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Every table by its name, as the unsharded module (see the class doc and
        :mod:`neo.distributed.state_dict`); the local module's own keys are dropped
        (``_drop_local_entries``)."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.pop(prefix + ANCHOR, None)
        save_tables(self, destination, prefix)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Copy each table's entries into this rank's shards (a ShardedTensor of its shards or the
        full table); absent keys are missing, wrong shapes errors naming the table. A state dict of
        the earlier rank-local keys (``lookup.<table>#<k>.*``) is left to the local module."""
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if prefix + ANCHOR in missing_keys:     # never saved (_save_to_state_dict)
            missing_keys.remove(prefix + ANCHOR)
        self._loading = load_tables(self, state_dict, prefix, missing_keys, error_msgs)
        unexpected_keys[:] = [k for k in unexpected_keys if k not in self._loading.taken]
