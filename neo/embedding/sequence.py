"""Unpooled ("sequence") lookups of a :class:`~neo.embedding.TableBatchedEmbedding`: one
embedding per id, as TorchRec's ``EmbeddingCollection`` and FBGEMM's ``PoolingMode.NONE``
give, for models that attend over a sample's ids (histories, sessions) instead of pooling them.

Example::

    emb = TableBatchedEmbedding([TableConfig("item", 1000, 16, feature_names=("item", "item_hist"))])
    seq = emb.sequence(batch)      # {"item": SequenceEmbedding, "item_hist": SequenceEmbedding}
    seq["item_hist"].values        # (ids of item_hist in the batch, 16), in the batch's order
    seq["item_hist"].lengths       # (B,): ids per sample
    loss(seq).backward()           # the fused update, as for pooled lookups: no .grad

The same kernels serve it: each table's ids (all its features' ids, concatenated) are looked up
as bags of one id, through a one-feature view of the table's group layout (the same weight and
optimizer-state buffers), so the output row of a bag is its id's row. The backward is the
group's fused update on those per-id gradients: a row that several ids (of one feature or of
several features of its table) touch gets their summed gradient and one optimizer step, as in
the pooled lookup, and all the tables of a group share the step count of this lookup (Adam's
and LAMB's bias correction), as they do pooled.

Invalid ids with ``validate=False``: zero rows, no update, and counted per table in the module's
:attr:`~neo.embedding.TableBatchedEmbedding.skipped_ids`, together with the pooled lookups'.

Cached tables (``placement: cached``): the batch's rows are made resident first (or taken from
``emb.prefetch(batch)``), the ids become cache slots, and the batch leaves the cache's flight
after the update (or at once without autograd), as for pooled lookups.

Not supported (each a clear error): per-sample weights (an unpooled id has nothing to weigh)
and the ``fbgemm`` backend (``reference``, ``cpu`` and ``triton`` serve it).
Sharded tables: :meth:`neo.distributed.ShardedEmbeddingCollection.sequence`
(:mod:`neo.distributed.sequence`) runs this lookup on every rank's shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

import torch

from neo.embedding.cache import Prefetched
from neo.embedding.anchor import anchor_grad
from neo.embedding.checks import EmbeddingInputError, check_features
from neo.embedding.loss_scale import record_overflow, unscaled_gradient
from neo.sparse import KeyedJaggedBatch, offsets_from_lengths

if TYPE_CHECKING:
    from neo.embedding.group_runner import GroupRunner
    from neo.embedding.module import TableBatchedEmbedding

__all__ = ["SequenceEmbedding", "sequence_lookup"]

SEQUENCE_BACKENDS = ("reference", "cpu", "triton")


@dataclass
class SequenceEmbedding:
    """A feature's unpooled embeddings, jagged by sample (TorchRec's ``JaggedTensor``)."""

    values: torch.Tensor      # (N, D): row i = the embedding of the feature's i-th id in the batch
    lengths: torch.Tensor     # (B,) int: ids per sample

    @property
    def offsets(self) -> torch.Tensor:
        """(B + 1,): sample b's rows are ``values[offsets[b]:offsets[b + 1]]``."""
        return offsets_from_lengths(self.lengths)

    def to_torchrec(self):
        """As ``torchrec.JaggedTensor`` (what TorchRec's ``EmbeddingCollection`` returns per
        feature; requires torchrec). Shares the tensors (autograd flows through)."""
        from torchrec.sparse.jagged_tensor import JaggedTensor

        return JaggedTensor(values=self.values, lengths=self.lengths, offsets=self.offsets)

    def to_padded(self, max_len: Optional[int] = None) -> torch.Tensor:
        """(B, max_len, D), zeros past each sample's ids (``max_len`` default: the longest)."""
        B, D = self.lengths.numel(), self.values.shape[1]
        L = int(self.lengths.max()) if max_len is None and B else (max_len or 0)
        pos = torch.arange(self.values.shape[0], device=self.values.device) - \
            torch.repeat_interleave(self.offsets[:-1], self.lengths.to(torch.int64))
        keep = pos < L
        out = self.values.new_zeros(B, L, D)
        sample = torch.repeat_interleave(torch.arange(B, device=self.values.device), self.lengths.to(torch.int64))
        out[sample[keep], pos[keep]] = self.values[keep]
        return out


class _SequenceLookup(torch.autograd.Function):
    """Forward: every table's ids as bags of one, ``(N_t, D_t)`` each. Backward: each group's
    fused update with the step count its tables share; then the cached tables' rows of this
    batch may be evicted again. One node for the whole lookup, so that the update runs (and the
    batch leaves the cache's flight) even where the loss reads only some features."""

    @staticmethod
    def forward(ctx, anchor, lookups: List["_Lookup"], prefetched: Optional[Prefetched],
                on_invalid: Optional[Callable[[], None]], *ids: torch.Tensor):
        ctx.lookups, ctx.prefetched = lookups, prefetched
        ctx.save_for_backward(*ids)
        return tuple(_lookup(lk.runner, i, on_invalid, lk.invalid_counts) for lk, i in zip(lookups, ids))

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        owner = ctx.lookups[0].runner.owner
        # each group's step is counted here, as the pooled lookup's backward counts it: lookups
        # whose forwards ran before either backward take steps t + 1, t + 2, ... in backward order
        steps: Dict[int, int] = {}
        for lk in ctx.lookups:
            if lk.runner.index not in steps:              # one read (a device sync on a GPU) per group
                steps[lk.runner.index] = int(lk.runner.step) + 1
        device = grads[0].device
        grads = [unscaled_gradient(owner, g) for g in grads]   # None: a loss scaler's overflow
        if any(g is None for g in grads):
            record_overflow(owner, device)                  # one skip for the whole lookup
            grads = []
        with (owner.timers("embedding_bwd") if owner.timers is not None else contextlib.nullcontext()):
            for lk, ids, grad in zip(ctx.lookups, saved, grads):
                owner.backend.backward_update(
                    lk.runner.layout, lk.runner.weights, lk.runner.states, grad,
                    ids, _bags_of_one(ids), None, ids.numel(), owner.learning_rates[lk.runner.index],
                    steps[lk.runner.index],
                    owner.rounding_seed,
                )
        for lk in ctx.lookups[:len(grads)]:
            lk.runner.step.fill_(steps[lk.runner.index])
        if ctx.prefetched is not None:
            owner._cache.complete(ctx.prefetched)
        return (anchor_grad(ctx, owner), None, None, None) + (None,) * len(saved)


@dataclass
class _Lookup:
    runner: "GroupRunner"      # one table of a group, as one feature (see _table_runner)
    invalid_counts: Optional[torch.Tensor] = None   # (1,) int32: the table's invalid ids, counted by the kernel


def _bags_of_one(ids: torch.Tensor) -> torch.Tensor:
    """(N + 1,) offsets: every id a bag of its own."""
    return torch.arange(ids.numel() + 1, dtype=torch.int64, device=ids.device)


def _lookup(runner: "GroupRunner", ids: torch.Tensor, on_invalid: Optional[Callable[[], None]] = None,
            invalid_counts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(N, D): ``ids`` as bags of one. ``on_invalid``: called when the backend counted invalid
    ids (to raise, naming the id; with ``validate=False``, to have them counted). ``invalid_counts``:
    (1,) int32 the backend adds the invalid ids into (``counts_invalid_per_feature``: triton)."""
    from neo.embedding.group_runner import pool

    rows = pool(runner, ids, _bags_of_one(ids), None, ids.numel(), invalid_counts=invalid_counts)
    if on_invalid is not None and runner.owner.backend.last_invalid_count:
        on_invalid()
    return rows


def _table_runner(emb: "TableBatchedEmbedding", g: "GroupRunner", t: int) -> "GroupRunner":
    """A runner over group ``g``'s buffers whose layout has one feature reading its table ``t``
    unpooled (made once per table and kept: backends may key state on the layout)."""
    from neo.embedding.group_runner import GroupRunner

    key = (g.index, t)
    runner = emb._sequence_runners.get(key)
    if runner is None:
        L, dev = g.layout, g.layout.feature_table.device
        view = dataclasses.replace(
            L, features=[L.tables[t].name],
            feature_table=torch.tensor([t], dtype=torch.int64, device=dev),
            output_offsets=torch.tensor([0, int(L.table_dims[t])], dtype=torch.int64, device=dev),
            feature_mean=torch.zeros(1, dtype=torch.int64, device=dev))
        runner = emb._sequence_runners[key] = GroupRunner(emb, g.index, view)
    return runner


def _check(emb: "TableBatchedEmbedding", batch: KeyedJaggedBatch, counted: bool) -> None:
    if emb.backend_name not in SEQUENCE_BACKENDS:
        raise EmbeddingInputError(f"unpooled lookups (sequence) run on the {list(SEQUENCE_BACKENDS)} backends, "
                                  f"not '{emb.backend_name}'")
    if batch.weights is not None:
        raise EmbeddingInputError("unpooled lookups (sequence) take no per-sample weights: the batch has weights")
    if emb.validate:
        batch.ensure_checked()
        check_features(batch, emb.feature_names, emb.feature_table)
        if not counted:                 # before a cache moves anything
            emb._check_batch_ids(batch)


def _raiser(emb: "TableBatchedEmbedding", batch: KeyedJaggedBatch) -> Callable[[], None]:
    return lambda: emb._invalid.name_counted(lambda: emb._check_batch_ids(batch))   # raises, naming the id


def sequence_lookup(emb: "TableBatchedEmbedding", batch: KeyedJaggedBatch) -> Dict[str, SequenceEmbedding]:
    """Every feature's embeddings, one row per id (module doc). The batch must hold exactly the
    module's features (as for the pooled lookup); ids are checked unless ``validate=False``,
    where invalid ids come out as zero rows, update nothing and are counted per table
    (:attr:`~neo.embedding.TableBatchedEmbedding.skipped_ids`, as pooled lookups count them)."""
    # Backends that count invalid ids as they look up (cpu) make the separate pass over the ids
    # unnecessary on good input: it runs only to name the culprit once one is seen (as pooled)
    counted = emb.validate and getattr(emb.backend, "counts_invalid_ids", False) and not emb.has_cache
    # Backends that count them on the device (triton): read once after the lookups (validation)
    # or added to skipped_ids there (validate=False), as the pooled lookup does; a table's
    # features go through one launch, so its count goes to the first of them (skipped_ids sums
    # a table's features)
    kernel_counted = getattr(emb.backend, "counts_invalid_per_feature", False) and not emb.has_cache \
        and (emb.validate or emb.count_skipped)
    counts = emb._invalid.kernel_counts() if kernel_counted else None                 # (F,) group order
    _check(emb, batch, counted or kernel_counted)
    on_invalid = _raiser(emb, batch) if counted else None
    # validate=False: the kernels skip invalid ids and the module counts them (skipped_ids), as
    # pooled; a backend that counts them as it looks up (cpu; cached tables' invalid ids are slot
    # -1, which it counts too) says whether there are any, so good input costs no extra pass
    count = not emb.validate and emb.count_skipped
    kernel_counts = getattr(emb.backend, "counts_invalid_ids", False)
    seen_invalid: List[bool] = []
    if count and kernel_counts:
        on_invalid = lambda: seen_invalid.append(True)  # noqa: E731
    train = emb._trains()
    # cached tables: this batch's rows made resident (or taken from a prefetch); ids become slots
    prefetched = emb._cache.take(batch, train) if emb.has_cache else None
    by_feature: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
    for f in batch.keys:
        values, lengths, _ = batch.feature(f)
        ids = values.to(torch.int64)
        if prefetched is not None and f in prefetched.slots:
            ids = prefetched.slots[f].to(torch.int64)
        by_feature[f] = (ids, lengths)
    lookups: List[_Lookup] = []
    table_ids: List[torch.Tensor] = []             # per table: all its features' ids, concatenated
    features: List[List[str]] = []
    for g in emb.groups:
        for t, cfg in enumerate(g.layout.tables):
            feats = [f for f in cfg.feature_names if f in by_feature]
            ids = torch.cat([by_feature[f][0] for f in feats]) if feats else torch.zeros(0, dtype=torch.int64)
            at = emb._group_order.index(cfg.feature_names[0])
            lookups.append(_Lookup(_table_runner(emb, g, t), None if counts is None else counts[at : at + 1]))
            table_ids.append(ids)
            features.append(feats)
    if train:
        rows = _SequenceLookup.apply(emb.autograd_anchor, lookups, prefetched, on_invalid, *table_ids)
    else:
        rows = [_lookup(lk.runner, ids, on_invalid, lk.invalid_counts) for lk, ids in zip(lookups, table_ids)]
        if prefetched is not None:
            emb._cache.complete(prefetched)              # no backward will come
    if counts is not None:
        emb._invalid.settle(counts, emb.validate, lambda: emb._check_batch_ids(batch))
    elif count and (seen_invalid or not kernel_counts):        # its own ids (not cache slots), in group order
        p = batch.permute(emb._group_order)
        emb._invalid.count(p.values.to(torch.int64), p.offsets.to(torch.int64), p.batch_size)
    out: Dict[str, SequenceEmbedding] = {}
    for feats, r in zip(features, rows):                                                 # r: (N_t, D_t)
        for f, part in zip(feats, torch.split(r, [by_feature[f][0].numel() for f in feats])):
            out[f] = SequenceEmbedding(part, by_feature[f][1])
    return {f: out[f] for f in batch.keys}
