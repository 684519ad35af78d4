"""TableBatchedEmbedding: many embedding tables, one kernel launch per group, optimizer fused into backward.

Example::

    tables = [TableConfig("user", num_rows=1000, dim=16, optimizer=OptimizerConfig("adagrad", lr=0.1)),
              TableConfig("item", num_rows=500, dim=8, feature_names=("item", "item_hist"))]
    emb = TableBatchedEmbedding(tables, backend="cpu")
    pooled = emb(batch)          # (B, 16 + 8 + 8): features user, item, item_hist in table order
    loss(pooled).backward()      # updates the touched rows in place; no .grad, no optimizer.step()

Tables with the same weight dtype and optimizer share a group: one flat buffer and one
kernel launch (see :mod:`neo.embedding.layout`). The backward pass never forms a dense
gradient: the backend sums each touched row's gradients and applies the optimizer to it
in the same pass.

Input checks (``validate=True``, the default): a batch built with ``validate=False`` has its
layout checked (:meth:`~neo.sparse.KeyedJaggedBatch.ensure_checked`, a
:class:`~neo.sparse.JaggedValidationError` naming the feature); the batch's features must be
exactly the module's, ids must be int32/int64, and every id must lie in ``[0, rows)`` of its
table; failures raise :class:`~neo.embedding.checks.EmbeddingInputError` naming feature and
table. ``validate=False`` skips them for speed: backends then ignore invalid ids (they
contribute zero and are not updated) rather than touch memory out of bounds, and the module
counts them per table (:attr:`TableBatchedEmbedding.skipped_ids`).

Per-id weights (``batch.weights``) that require grad get their gradient, ``<row, gradient of
the bag's pooled row>`` per id (over the bag length for mean pooling), from the rows before the
update, in training and in eval mode (cached tables: in training only).

Cached tables (``placement: cached``, :mod:`neo.embedding.cache`): the group buffers hold
only their cache slots; a batch's rows are made resident before its lookup (``prefetch`` /
``prefetch_async``, or at the lookup itself) and its ids become slots, so the same kernels
run unchanged and train exactly as if every row were in fast memory (fp32: bit for bit).

Meta placeholder (``device="meta"``): the checked table configs and no storage, for a model
whose tables are sharded later (``neo.distributed.parallelize``); using its tables raises.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn

from neo.config.embedding import Placement, TableConfig
from neo.embedding.anchor import ANCHOR, new_anchor, restore_anchor
from neo.embedding.backends import get_backend, resolve_backend_name
from neo.embedding.cache import ModuleCache, TableCache, make_store
from neo.embedding.cache.moves import moves_for
from neo.embedding.checks import EmbeddingInputError, check_features
from neo.embedding.invalid_ids import InvalidIds
from neo.embedding.ddp_guard import refuse_ddp_buffer_sync
from neo.embedding.exported import exported_lookup
from neo.embedding.group_runner import GroupRunner, PooledLookup, ids_of_bags, pool
from neo.embedding.init import TableRegion, fill_rows
from neo.embedding.layout import GroupLayout, group_tables
from neo.embedding.module_cache import CachedTables
from neo.embedding.placeholder import needs_tables
from neo.embedding.table_rates import TableRates
from neo.embedding.table_state import load_tables, save_tables
from neo.embedding.transforms import lookup_method
from neo.embedding.variable_batch import own_bags, take_rows
from neo.keyed_embeddings import KeyedEmbeddings
from neo.sparse import KeyedJaggedBatch, as_batch, is_variable_batch, padded_variable_batch

if TYPE_CHECKING:
    from neo.embedding.sequence import SequenceEmbedding

__all__ = ["TableBatchedEmbedding", "EmbeddingInputError"]


class TableBatchedEmbedding(CachedTables, TableRates, nn.Module):
    """Embedding tables looked up together; see the module docstring.

    Args:
        tables: the tables; their feature names must be distinct across tables.
        backend: ``"auto"`` (cpu kernels on CPU if built, triton on CUDA), ``"reference"``,
            ``"cpu"``, ``"triton"`` or ``"fbgemm"``.
        device: where weights and optimizer state live. ``"meta"``: a placeholder that checks and
            keeps the table configs (:attr:`tables`, :attr:`feature_names`, :meth:`feature_slices`,
            :attr:`output_dim`) and allocates nothing, for a model whose tables are sharded later
            (``neo.distributed.parallelize(model, path, plan, pg)`` replaces it by this rank's
            shards, TorchRec's meta-device pattern); every use of the tables (lookups, state
            dict, weights, learning rates, the cache, ``.to()``) raises a RuntimeError saying so.
        validate: check inputs and name the feature and table at fault (see module doc).
        count_skipped: with ``validate=False``, count the invalid ids the kernels skip
            (:attr:`skipped_ids`). False where the ids were checked or counted before they came
            here (the sharded collection's local lookup: its input distribution checks or counts
            them at the source, ``ShardedEmbeddingCollection.skipped_ids``): then nothing is
            counted and :attr:`skipped_ids` raises.
        seed: seeds the initial weights (per table and block, :mod:`neo.embedding.init`:
            the same values whatever the tables' grouping, order or sharding) and, unless
            ``rounding_seed`` is given, stochastic rounding.
        regions: for tables that are shards of larger ones, where each sits in its table
            (``{name: TableRegion}``), so that it starts at that table's values for its rows and
            columns; the others start as whole tables of their own name.
        rounding_seed: seed of stochastic rounding (default ``seed``); the sharded collection
            gives each rank its own.
        store_dir: directory of the backing files of cached tables on ``mmap`` stores (a
            table's ``cache_dir`` overrides it).
    """

    is_meta = False
    """A placeholder (``device="meta"``): configs alone (:mod:`.placeholder`; a class default for older pickles)."""

    grad_scaler: Optional[torch.amp.GradScaler] = None
    """The ``torch.amp.GradScaler`` that scales the loss, if any (set it: ``emb.grad_scaler = scaler``):
    the fused updates divide their gradients by its scale and skip an overflowed step
    (:mod:`neo.embedding.loss_scale`)."""

    skipped_updates = 0
    """Fused updates skipped because the loss scaler's gradient overflowed (inf or NaN)."""

    reports_overflow = True
    """Whether a skipped update is reported to ``grad_scaler`` (its next ``update()`` lowers the
    scale); False on a sharded collection's ranks (:mod:`neo.embedding.loss_scale`)."""

    def __init__(
        self,
        tables: Sequence[TableConfig],
        backend: str = "auto",
        device: Optional[torch.device | str] = None,
        validate: bool = True,
        seed: int = 0,
        store_dir: Optional[str] = None,
        count_skipped: bool = True,
        regions: Optional[Mapping[str, TableRegion]] = None,
        rounding_seed: Optional[int] = None,
    ):
        super().__init__()
        tables = list(tables)
        if not tables:
            raise ValueError("TableBatchedEmbedding needs at least one table")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names repeat: {names}")
        self.feature_table: Dict[str, str] = {}
        for t in tables:
            for f in t.feature_names:
                if f in self.feature_table:
                    raise ValueError(f"feature '{f}' is read by tables '{self.feature_table[f]}' and '{t.name}'")
                self.feature_table[f] = t.name
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.tables = tables
        self.feature_names = [f for t in tables for f in t.feature_names]
        self.validate, self.seed, self.count_skipped = validate, seed, count_skipped
        self.rounding_seed = seed if rounding_seed is None else rounding_seed
        regions = dict(regions or {})
        by_name = {t.name: t for t in tables}
        for name, r in regions.items():
            cfg = by_name.get(name)
            if cfg is None:
                raise ValueError(f"regions: no table '{name}' (tables: {names})")
            if (r.rows, r.cols) != (cfg.num_rows, cfg.dim):
                raise ValueError(f"regions: table '{name}' is {cfg.num_rows} x {cfg.dim}, but its region of "
                                 f"'{r.table}' is {r.rows} x {r.cols}")
        self.timers = None
        """Optional ``timers(name)`` context manager factory: the fused backward is timed as ``embedding_bwd``."""
        self.autograd_anchor = new_anchor(device)
        """(0,): autograd's way into the fused backward, and :attr:`frozen` (:mod:`neo.embedding.anchor`)."""
        self.backend_name = resolve_backend_name(backend, device)
        self.is_meta = device.type == "meta"
        self.groups: List[GroupRunner] = []
        self.learning_rates: List[float] = []
        self._cache: Optional[ModuleCache] = None
        if self.is_meta:
            return
        self.backend = get_backend(self.backend_name)

        caches: Dict[str, TableCache] = {}
        moves = moves_for(self.backend_name) if any(t.cached for t in tables) else None
        for gi, members in enumerate(group_tables(tables)):
            layout = GroupLayout.build(members, device)
            opt = layout.optimizer
            state_init = [opt.initial_accumulator_value if n == "sum" else 0.0 for n in opt.type.state_names()]
            weights = torch.empty(layout.num_weights, dtype=torch.float32)
            stores = {}
            for t, cfg in enumerate(members):
                scale = cfg.init_scale if cfg.init_scale is not None else cfg.num_rows ** -0.5
                off, n = int(layout.weight_offsets[t]), cfg.num_rows * cfg.dim
                region = regions.get(cfg.name) or TableRegion.whole(cfg.name, cfg.num_rows, cfg.dim)
                if cfg.cached:           # the same numbers, drawn into the backing store
                    stores[t] = make_store(cfg, device, store_dir)
                    stores[t].initialize(region, seed, scale, state_init)
                    weights[off : off + cfg.cache_capacity * cfg.dim].zero_()
                else:
                    fill_rows(weights[off : off + n].view(cfg.num_rows, cfg.dim), region, seed, scale)
            # the group's flat buffers are not in the state dict: it holds each table by name instead
            # (_save_to_state_dict), so that a state dict cannot load into tables of another layout
            self.register_buffer(f"group{gi}_weights", weights.to(device=device, dtype=layout.dtype.torch_dtype),
                                 persistent=False)
            state_len = layout.num_rows if opt.type.rowwise_state else layout.num_weights
            for name, init in zip(opt.type.state_names(), state_init):
                self.register_buffer(f"group{gi}_{name}", torch.full((state_len,), init, dtype=torch.float32, device=device),
                                     persistent=False)
            self.register_buffer(f"group{gi}_step", torch.zeros((), dtype=torch.int64), persistent=False)
            runner = GroupRunner(self, gi, layout)
            self.groups.append(runner)
            self.learning_rates.append(opt.lr)
            for t, store in stores.items():
                cfg = members[t]
                caches[cfg.name] = TableCache(cfg, runner.table_slots(t), runner.table_state_slots(t), store, moves)
                if cfg.cache_capacity >= cfg.num_rows:
                    warnings.warn(f"table '{cfg.name}': its cache of {cfg.cache_capacity} rows holds all "
                                  f"{cfg.num_rows} rows, so nothing is ever evicted; placement: device does the "
                                  "same without the copies", stacklevel=2)
        if caches:
            self._cache = ModuleCache(caches, {t.name: t.feature_names for t in tables if t.name in caches})

        self._group_order = [f for g in self.groups for f in g.layout.features]
        # column permutation from group order back to table order (None when already equal)
        if self._group_order == self.feature_names:
            self._out_perm = None
        else:
            dims = {f: next(t.dim for t in tables if f in t.feature_names) for f in self.feature_names}
            starts, acc = {}, 0
            for f in self._group_order:
                starts[f] = acc
                acc += dims[f]
            self._out_perm = torch.cat([torch.arange(starts[f], starts[f] + dims[f]) for f in self.feature_names]).to(device)
        self._sequence_runners: Dict[tuple, GroupRunner] = {}   # one-feature views for sequence()
        # per feature (group order): its table's rows (the id checks) and the ids skipped, on the
        # tables' device. Not buffers (those are the tables' state): _apply moves them.
        num_rows = {t.name: t.num_rows for t in tables}
        table_of = [self.feature_table[f] for f in self._group_order]
        self._invalid = InvalidIds(self._group_order, table_of, [num_rows[t] for t in table_of], device)

    # ------------------------------------------------------------------ forward
    @property
    def output_dim(self) -> int:
        return sum(self.feature_dims)

    @property
    def feature_dims(self) -> List[int]:
        by_feature = {f: t.dim for t in self.tables for f in t.feature_names}
        return [by_feature[f] for f in self.feature_names]

    def feature_slices(self) -> Dict[str, slice]:
        """Each feature's columns in :meth:`forward`'s ``(B, sum of D)`` output (table order:
        :attr:`feature_names`, widths :attr:`feature_dims`), e.g. ``{"user": slice(0, 16), ...}``."""
        out, c = {}, 0
        for f, d in zip(self.feature_names, self.feature_dims):
            out[f] = slice(c, c + d)
            c += d
        return out

    @needs_tables
    def keyed(self, batch: KeyedJaggedBatch) -> KeyedEmbeddings:
        """:meth:`forward`'s output keyed by feature (TorchRec's ``KeyedTensor``): ``.to_dict()``
        gives ``{feature: (B, D) view}``, ``.regroup(groups)`` concatenates named features."""
        return KeyedEmbeddings.of(self, self(batch))

    def _variable_batch(self, kjt, pooled_bags: Optional[torch.Tensor]) -> torch.Tensor:
        """(B, sum of D) of a variable-batch KJT: the ``max_f B_f`` padded distinct bags pooled
        (:func:`neo.sparse.padded_variable_batch`), then feature ``f``'s columns of sample ``b``
        from padded row ``inverse[f][b]``; backward sums the samples sharing a bag (index_select),
        the fused update then sees each distinct bag once."""
        if pooled_bags is not None:
            raise EmbeddingInputError("pooled_bags is not supported with a variable-batch KeyedJaggedTensor")
        padded, inverse = padded_variable_batch(kjt, validate=self.validate)
        pooled = self(padded)                                          # (max B_f, sum of D)
        slices = self.feature_slices()
        return take_rows(pooled, [slices[f] for f in self.feature_names], [inverse[f] for f in self.feature_names])

    @needs_tables
    @lookup_method
    def forward(self, batch: KeyedJaggedBatch, pooled_bags: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Pooled embeddings ``(B, sum of D)``, features in table order.

        ``pooled_bags``: (F * B,) bool in ``batch``'s key order, the bags to pool, the others zeros;
        the fused backward still updates from every bag (data-parallel replicas pool their own
        samples, and apply the whole global batch's update). ``batch`` may be a ``torchrec.KeyedJaggedTensor``
        (:func:`neo.sparse.as_batch`), variable-batch (VBE) included (:meth:`_variable_batch`). Under
        torch.func's transforms the lookup is a constant of the function (:mod:`neo.embedding.transforms`)."""
        if is_variable_batch(batch):
            return self._variable_batch(batch, pooled_bags)
        batch = as_batch(batch)
        if torch.compiler.is_exporting():            # one custom op, for inference (neo/embedding/exported.py)
            return exported_lookup(self, batch, pooled_bags)
        if self.validate:
            batch.ensure_checked()        # the layout, where the batch was built with validate=False
            check_features(batch, self.feature_names, self.feature_table)
        if pooled_bags is not None:
            n_bags = len(batch.keys) * batch.batch_size
            if (not isinstance(pooled_bags, torch.Tensor) or pooled_bags.dtype != torch.bool
                    or tuple(pooled_bags.shape) != (n_bags,)):
                raise EmbeddingInputError(
                    f"pooled_bags must be a bool tensor of F * B = {n_bags} flags, one per bag, got "
                    f"{getattr(pooled_bags, 'dtype', type(pooled_bags).__name__)} of shape "
                    f"{tuple(getattr(pooled_bags, 'shape', ()))}")
        train = self._trains()
        # per-id weights that require grad (TorchRec's position-weighted features): their gradient
        # comes from the lookup's node; in eval mode a node that updates nothing
        weights_grad = batch.weights is not None and batch.weights.requires_grad and torch.is_grad_enabled()
        if weights_grad and not train and self._cache is not None:
            cached = ", ".join(t.name for t in self.tables if t.placement is Placement.CACHED)
            raise EmbeddingInputError(
                f"per-id weights that require grad, in eval mode, with cached tables ({cached}): their gradient "
                f"needs the rows as they were looked up, which the cache does not keep outside training; look "
                f"up in train mode, or detach the weights (or use torch.no_grad()) for evaluation")
        prefetched = None
        if self._cache is not None:
            if self.validate:        # the caches see valid ids only: name a bad one before anything moves
                self._check_batch_ids(batch)
            prefetched = self._cache.take(batch, train)
        if pooled_bags is not None and list(batch.keys) != self._group_order:   # (F, B) flags, rows in group order
            pos = {k: i for i, k in enumerate(batch.keys)}
            pooled_bags = pooled_bags.view(len(batch.keys), batch.batch_size)[[pos[f] for f in self._group_order]]
            pooled_bags = pooled_bags.reshape(-1)
        batch = batch.permute(self._group_order)
        B = batch.batch_size
        ids = batch.values.to(torch.int64)
        values = ids if prefetched is None else prefetched.substitute(batch, ids)   # cached tables: slots
        offsets = batch.offsets.to(torch.int64)
        psw = None if batch.weights is None else batch.weights.to(torch.float32)
        pooled = None
        if pooled_bags is not None:                      # the same bags, the unpooled ones emptied
            keep = ids_of_bags(pooled_bags, offsets, values.numel())
            p_off = torch.zeros_like(offsets)
            torch.cumsum(batch.lengths.to(torch.int64) * pooled_bags, 0, out=p_off[1:])
            pooled = (values.masked_select(keep), p_off, None if psw is None else psw.masked_select(keep))
        # Backends that count invalid ids in their forward pass (cpu) make the separate id
        # check unnecessary on good input: it runs only to name the culprit once one is seen.
        # Not with pooled_bags: the forward never sees the ids of the other bags, the update does.
        counted = self.validate and getattr(self.backend, "counts_invalid_ids", False) and pooled is None
        # Backends that count them per feature on the device (triton): the check reads the counts
        # once after the lookup, and validate=False adds them to the skip count, with no pass of
        # torch operations over the ids (on an H200 those took longer than the lookup at batch 4096)
        per_feature = None
        if getattr(self.backend, "counts_invalid_per_feature", False) and pooled is None and prefetched is None \
                and (self.validate or self.count_skipped):
            per_feature = self._invalid.kernel_counts()                                     # (F,)
        id_check = lambda: self._invalid.check(ids, offsets, B)  # noqa: E731
        if self.validate and not counted and per_feature is None and prefetched is None:
            id_check()
        anchor = self.autograd_anchor if train else None   # makes autograd call the fused backward
        outputs, f0 = [], 0
        # validate=False: the kernels skip invalid ids; a backend that counts them in its forward
        # (cpu) says whether there are any, the others are counted here (skipped_ids)
        kernel_counts = getattr(self.backend, "counts_invalid_ids", False) and pooled is None
        seen_invalid = 0
        # (F + 1,): each feature's first id, then the end; one .tolist() for every group's range
        feature_starts = offsets[::B].tolist() if B else [0] * (len(self._group_order) + 1)
        for g in self.groups:
            nf = len(g.layout.features)
            lo, hi = feature_starts[f0], feature_starts[f0 + nf]   # the group's ids: values[lo:hi]
            g_off = offsets[f0 * B : (f0 + nf) * B + 1]   # the kernels want offsets from 0
            if lo:
                g_off = g_off - lo
            g_psw = None if psw is None else psw if lo == 0 and hi == psw.numel() else psw[lo:hi]
            g_pooled = None
            if pooled is not None:
                pv, po, pw = pooled
                plo, phi = int(po[f0 * B]), int(po[(f0 + nf) * B])
                g_pooled = (pv[plo:phi], po[f0 * B : (f0 + nf) * B + 1] - plo, None if pw is None else pw[plo:phi])
            g_counts = None if per_feature is None else per_feature[f0 : f0 + nf]
            if anchor is None and not weights_grad:        # no backward will come: no autograd node
                outputs.append(pool(g, *(g_pooled or (values[lo:hi], g_off, g_psw)), B, invalid_counts=g_counts))
            else:
                outputs.append(PooledLookup.apply(anchor, g, values[lo:hi], g_off, g_psw, B, prefetched, g_pooled,
                                                  train, None if pooled is None else keep[lo:hi], g_counts))
            if counted and self.backend.last_invalid_count:
                self._invalid.name_counted(id_check)          # raises, naming feature, table and id
            if not self.validate and kernel_counts:
                seen_invalid += self.backend.last_invalid_count
            f0 += nf
        if per_feature is not None:
            self._invalid.settle(per_feature, self.validate, id_check)
        elif not self.validate and self.count_skipped and (seen_invalid or not kernel_counts):
            self._invalid.count(ids, offsets, B)
        if prefetched is not None and anchor is None:
            self._cache.complete(prefetched)          # no backward will come
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)   # (B, sum D) group order
        if self._out_perm is not None:
            out = out.index_select(1, self._out_perm)                           # (B, sum D) table order
        return out

    @needs_tables
    @lookup_method
    def sequence(self, batch: KeyedJaggedBatch) -> Dict[str, "SequenceEmbedding"]:
        """Unpooled lookup: every feature's embeddings, one row per id, jagged by sample
        (``{feature: SequenceEmbedding(values (N, D), lengths (B,))}``), trained by the same fused
        update; see :mod:`neo.embedding.sequence`."""
        from neo.embedding.sequence import sequence_lookup

        if is_variable_batch(batch):               # each feature's own B_f bags, as TorchRec's EC returns
            padded, _ = padded_variable_batch(batch, validate=self.validate)
            return own_bags(sequence_lookup(self, padded), batch)
        return sequence_lookup(self, as_batch(batch))

    def _check_batch_ids(self, batch: KeyedJaggedBatch) -> None:
        p = batch.permute(self._group_order)
        self._invalid.check(p.values.to(torch.int64), p.offsets.to(torch.int64), p.batch_size)

    # ------------------------------------------------------- weights and state
    def _locate(self, name: str):
        for g in self.groups:
            for t, cfg in enumerate(g.layout.tables):
                if cfg.name == name:
                    return g, t, cfg
        raise KeyError(f"no table named '{name}' (tables: {[t.name for t in self.tables]})")

    @needs_tables
    def table_weight(self, name: str) -> torch.Tensor:
        """A ``(rows, D)`` view of one table's weights, in their storage dtype (writes go through).

        A cached table's view is its backing store after a flush (see :meth:`_store_view`)."""
        g, t, cfg = self._locate(name)
        if cfg.cached:
            return self._store_view(cfg).weights
        return g.table_slots(t)

    @needs_tables
    def table_optimizer_state(self, name: str) -> Dict[str, torch.Tensor]:
        """Views of one table's optimizer state: ``(rows, D)`` per element, ``(rows,)`` per row."""
        g, t, cfg = self._locate(name)
        views = self._store_view(cfg).states if cfg.cached else g.table_state_slots(t)
        return dict(zip(cfg.optimizer.type.state_names(), views))

    def _trains(self) -> bool:
        """Whether a lookup (pooled or :meth:`sequence`) trains the tables: grad mode, train mode, not :attr:`frozen`;
        then a plain DDP forward that would overwrite the other ranks' updates is refused (:mod:`.ddp_guard`)."""
        train = torch.is_grad_enabled() and self.training and not self.frozen
        if train:
            refuse_ddp_buffer_sync(self)
        return train

    @property
    def frozen(self) -> bool:
        """Tables left as they are (``requires_grad_(False)`` here or on a parent, as for ``nn.EmbeddingBag``;
        :mod:`neo.embedding.anchor`): lookups as in evaluation, per-id weights still get their gradient."""
        return not self.autograd_anchor.requires_grad

    @frozen.setter
    def frozen(self, value: bool) -> None:
        self.autograd_anchor.requires_grad_(not value)

    @property
    @needs_tables
    def skipped_ids(self) -> Dict[str, int]:
        """Ids outside their table's rows that lookups (pooled and :meth:`sequence`) skipped since
        creation, each counted once, per table (with ``validate=False``: such ids contribute zero
        and get no update; with validation on, none is skipped: the batch is refused). Raises
        where ``count_skipped=False``."""
        if not self.count_skipped:
            raise RuntimeError("skipped ids are not counted: this module was built with count_skipped=False "
                               "(its ids are checked or counted before they reach it; a sharded collection "
                               "counts them at the source: ShardedEmbeddingCollection.skipped_ids)")
        return self._invalid.per_table(t.name for t in self.tables)

    @needs_tables
    def _apply(self, fn, recurse=True):
        """``.to(device)`` moves the tables; a change of dtype (``.half()``, ``.to(torch.bfloat16)``,
        ``model.double()`` on a model holding this module) is refused: the weights keep the
        storage type each table was configured with and the optimizer state stays fp32, which
        the fused kernels rely on. Set ``TableConfig.dtype`` instead."""
        for name, buf in self._buffers.items():
            if buf is not None and fn(buf[:0] if buf.dim() else buf.reshape(1)[:0]).dtype != buf.dtype:
                raise TypeError(f"TableBatchedEmbedding: {name} ({buf.dtype}) would change dtype: a table's weights keep "
                                "the storage type of its TableConfig.dtype and the optimizer state stays fp32; "
                                "set TableConfig.dtype (fp32, fp16, bf16) instead of converting the module")
        out = super()._apply(fn, recurse)
        self._invalid.apply(fn)
        return out

    def __setstate__(self, state: dict) -> None:
        """Unpickling: the caches' slots are views of this module's group buffers again."""
        super().__setstate__(state)
        restore_anchor(self, self.groups[0].weights.device if self.__dict__.get("groups") else torch.device("cpu"))
        cache = self.__dict__.get("_cache")
        if cache is not None:
            slots = {}
            for name in cache.caches:
                g, t, _ = self._locate(name)
                slots[name] = (g.table_slots(t), g.table_state_slots(t))
            cache.rebind(slots)

    # ------------------------------------------------------- state dict, by table
    @needs_tables
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """``TABLE.weight``, ``TABLE.<state>`` (e.g. ``TABLE.sum``, ``TABLE.exp_avg``) and
        ``TABLE.step`` for every table, like TorchRec's ``embedding_bags.TABLE.weight``: the keys
        and shapes name the tables, so loading into other tables fails naming them."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.pop(prefix + ANCHOR, None)
        save_tables(self, destination, prefix, keep_vars)

    @needs_tables
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if prefix + ANCHOR in missing_keys:     # never saved (_save_to_state_dict)
            missing_keys.remove(prefix + ANCHOR)
        load_tables(self, state_dict, prefix, missing_keys, unexpected_keys, error_msgs)
