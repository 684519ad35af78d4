"""Learnable position weights of features' ids (TorchRec's ``PositionWeightedModuleCollection``).

A feature's id at position p of its bag (0 for the first) gets the weight ``w_f[p]``, a learnable
parameter of ``max_length`` positions per feature, started at 1 (an unweighted sum). The pooled
row is then ``sum_p w_f[p] * row(id_p)``: the order of a user's last clicks, say, weighs in. Put
it before the embedding lookup::

    pw = PositionWeights({"clicks": 50, "views": 20})
    pooled = tables(pw(batch))            # TableBatchedEmbedding or ShardedEmbeddingCollection

The weights are per-id weights that require grad: the lookup computes their gradient
(``<row, gradient of the bag>`` per id), and a sharded collection sends it back from the shards
(:mod:`neo.distributed.input_dist`). The parameters are dense: under DDP their gradient is
averaged as any other (``parallelize`` leaves them to DDP).

In a training pipeline, which distributes batch i+1 before step i updates the weights, give it to
the sharded collection instead (``sec.weight_table = pw``; ``DLRM(..., position_weights=pw)``
does it, as for the trainer's ``model.position_weights``): each id then travels with its slot in
:meth:`table` (:meth:`table_index`) and the weight is read when the batch is looked up.

In eager mode on the CPU the slots, the read and its gradient are loops of ``neo._C``
(``position_slots``, ``position_read``: forward + backward 2.0x faster than the torch
operations at 16k ids, ``tools/bench_position_weights.py``); elsewhere (a GPU, ``neo._C`` not
built, ``torch.func`` transforms, tracing) the same in torch operations: the same slots and
weights, the gradient within rounding (the loops sum it in double). ``neo.export`` exports a
model with it (the torch operations: one pass over the batch's ids; the program's weights are its
buffers), for serving.

Bad input: a bag longer than its feature's ``max_length`` raises in eager mode, naming the
feature, the sample and the length (TorchRec's gather would fail on an index out of range).
Features of the batch without position weights keep their weights as they are, or have none
(all 1) where the batch has no weights. ``batch.weights`` of a weighted feature are replaced, as
TorchRec does.
"""

from __future__ import annotations

from typing import Dict, Mapping

import torch
from torch import nn

from neo.cpp import cpu_kernels
from neo.embedding.checks import EmbeddingInputError
from neo.sparse import KeyedJaggedBatch, as_batch

__all__ = ["PositionWeights"]


class PositionWeights(nn.Module):
    """Per-feature learnable weights by position in the bag; see the module docstring.

    Args:
        max_lengths: feature name -> the longest bag it may have (positions 0 .. max_length - 1).
    """

    def __init__(self, max_lengths: Mapping[str, int]):
        super().__init__()
        if not max_lengths:
            raise ValueError("PositionWeights: max_lengths names no feature")
        for f, n in max_lengths.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"PositionWeights: max_lengths['{f}'] must be an integer >= 1, got {n!r}")
        self.max_lengths: Dict[str, int] = dict(max_lengths)
        # a ParameterDict keyed by feature: the state dict's keys name the features ('weights.clicks')
        self.weights = nn.ParameterDict({f: nn.Parameter(torch.ones(n)) for f, n in self.max_lengths.items()})

    def table(self) -> torch.Tensor:
        """(sum of max_lengths + 1,) every feature's weights in turn, then a constant 1 (the slot of
        the features not named here): what :meth:`table_index` indexes."""
        params = [self.weights[f] for f in self.max_lengths]
        return torch.cat(params + [torch.ones(1, dtype=params[0].dtype, device=params[0].device)])

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """(N,) the weights at ``slots`` (:meth:`table_index`), differentiable."""
        params = [self.weights[f] for f in self.max_lengths]
        if _kernels(slots) is not None and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params):
            return _Read.apply(slots.contiguous(), *params)
        return self.table().to(slots.device)[slots]

    def table_index(self, batch) -> torch.Tensor:
        """(N,) int64: each id's place in :meth:`table`, its feature's start plus its position in the
        bag, or the last slot (weight 1) for a feature not named here. Raises (eager mode) where a
        bag is longer than its feature's ``max_length``. Torch operations over all ids at once, no
        read of the batch's data in Python, so that ``torch.export`` traces it."""
        batch = as_batch(batch)
        B, keys = batch.batch_size, batch.keys
        missing = [f for f in self.max_lengths if f not in keys]
        if missing:
            raise EmbeddingInputError(f"PositionWeights: feature '{missing[0]}' is not in the batch "
                                      f"(its features: {list(keys)})")
        dev = batch.values.device
        n = batch.values.numel()
        lay = self._layout(keys, B, dev)
        _C = _kernels(batch.values)
        if _C is not None:                                                         # one pass of neo._C
            slots, bad = _C.position_slots(batch.offsets.to(torch.int64).contiguous(), lay["first"],
                                           lay["limit_or_max"], lay["ones"], B, n)
            if bad >= 0:
                self._raise_too_long(keys, B, bad, int(batch.offsets[bad + 1] - batch.offsets[bad]))
            return slots
        lengths = batch.lengths.to(torch.int64)                                    # (F * B,)
        if not torch.compiler.is_exporting():
            self._check_lengths(lengths, keys, B, lay)
        # an id's slot: its feature's start + (its index - its bag's first index); one pass over the ids
        bag_term = lay["bag_start"] - batch.offsets.to(torch.int64)[:-1]           # (F * B,)
        slots = torch.repeat_interleave(bag_term, lengths, output_size=n) + torch.arange(n, device=dev)
        if lay["bag_covered"] is not None:                                         # features not named here
            covered = torch.repeat_interleave(lay["bag_covered"], lengths, output_size=n)
            slots = torch.where(covered, slots, torch.full_like(slots, lay["ones"]))
        return slots

    def forward(self, batch) -> KeyedJaggedBatch:
        """``batch`` (a KeyedJaggedBatch or ``torchrec.KeyedJaggedTensor``) with per-id weights:
        ``weights[f][position]`` for every feature named here, the batch's own (or 1) elsewhere."""
        batch = as_batch(batch)
        index = self.table_index(batch)                                            # (N,)
        weights = self.read(index)
        if batch.weights is not None:                  # the features not named here keep their own
            ones = sum(self.max_lengths.values())
            weights = torch.where(index == ones, batch.weights.to(weights.dtype), weights)
        return KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, batch.batch_size, weights=weights,
                                offsets=batch.offsets, validate=False)

    def _layout(self, keys, B: int, device) -> dict:
        """Per batch layout (keys, B, device): ``bag_start`` (F * B,) int64 each bag's feature's first
        slot in :meth:`table`; ``bag_covered`` (F * B,) bool, or None where every feature is named
        here; ``limit_or_max`` (F,) each feature's max_length (no limit where not named here);
        ``first`` (F,) int64 each feature's first slot, -1 where not named here; ``ones`` the
        constant slot. Cached, but for those made while ``torch.export`` traces or under a
        ``torch.func`` transform."""
        # not cached while torch.export traces (B may be symbolic) or under a torch.func transform
        # (tensors made then are the transform's wrappers, not to be reused outside it)
        traced = torch.compiler.is_exporting() or torch._C._are_functorch_transforms_active()
        key = None if traced else (tuple(keys), B, str(device))
        cache = self.__dict__.setdefault("_layouts", {})
        if key in cache:
            return cache[key]
        names, acc, first = list(self.max_lengths), 0, {}
        for f in names:
            first[f], acc = acc, acc + self.max_lengths[f]
        i64 = dict(dtype=torch.int64, device=device)
        limits = [self.max_lengths.get(f, 0) for f in keys]
        made = {"bag_start": torch.tensor([first.get(f, 0) for f in keys], **i64).repeat_interleave(B),
                "bag_covered": None if all(limits) else
                torch.tensor([m > 0 for m in limits], dtype=torch.bool, device=device).repeat_interleave(B),
                "limit_or_max": torch.tensor([m if m else 2 ** 62 for m in limits], **i64),
                "first": torch.tensor([first.get(f, -1) for f in keys], **i64),
                "ones": acc}
        if not traced:
            cache[key] = made
        return made

    def _check_lengths(self, lengths: torch.Tensor, keys, B: int, lay: dict) -> None:
        """Raise where a bag of a feature named here is longer than its ``max_length``."""
        if not B:
            return
        per_feature = lengths.view(len(keys), B)
        if not bool((per_feature.amax(1) > lay["limit_or_max"]).any()):
            return
        over = per_feature > lay["limit_or_max"].unsqueeze(1)
        k, b = (int(i) for i in over.nonzero()[0])
        self._raise_too_long(keys, B, k * B + b, int(lengths[k * B + b]))

    def _raise_too_long(self, keys, B: int, bag: int, length: int) -> None:
        """Raise for bag ``bag`` (feature * B + sample), of ``length`` ids."""
        k, b = divmod(bag, B)
        m = self.max_lengths[keys[k]]
        raise EmbeddingInputError(
            f"PositionWeights: feature '{keys[k]}': sample {b} has a bag of {length} ids, "
            f"longer than its max_length {m} (positions 0 .. {m - 1}); raise max_length or truncate the bags")

    def extra_repr(self) -> str:
        return f"max_lengths={self.max_lengths}"


def _kernels(t: torch.Tensor):
    """``neo._C`` where a call on ``t`` runs its position-weights loops: eager mode on the CPU (no
    tracing, export, compilation or ``torch.func`` transform, which need torch operations), else None."""
    if t.device.type != "cpu" or torch.jit.is_tracing() or torch.compiler.is_compiling() \
            or torch.compiler.is_exporting() or torch._C._are_functorch_transforms_active():
        return None
    return cpu_kernels("position_read")


class _Read(torch.autograd.Function):
    """The table's parts (each feature's weights, then a constant 1) at slots: ``neo._C`` loops
    forward and backward (the gradient summed at each slot in double, rounded once)."""

    @staticmethod
    def forward(ctx, slots: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(slots)
        ctx.sizes = [p.numel() for p in parts]
        return cpu_kernels("position_read").position_read(list(parts), slots)   # (N,)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (slots,) = ctx.saved_tensors
        grads = cpu_kernels("position_read").position_read_backward(grad.contiguous(), slots, ctx.sizes)
        return (None, *grads)
