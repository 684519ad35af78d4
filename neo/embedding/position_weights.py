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

``neo.export`` exports a model with it (one pass of torch operations over the batch's ids; the
program's weights are its buffers), for serving.

Bad input: a bag longer than its feature's ``max_length`` raises in eager mode, naming the
feature, the sample and the length (TorchRec's gather would fail on an index out of range). Features of the batch
without position weights keep their weights as they are, or have none (all 1) where the batch
has no weights. ``batch.weights`` of a weighted feature are replaced, as TorchRec does.
"""

from __future__ import annotations

from typing import Dict, Mapping

import torch
from torch import nn

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

    def forward(self, batch) -> KeyedJaggedBatch:
        """``batch`` (a KeyedJaggedBatch or ``torchrec.KeyedJaggedTensor``) with per-id weights:
        ``weights[f][position]`` for every feature named here, the batch's own (or 1) elsewhere.
        Torch operations over all ids at once, no read of the batch's data in Python, so that
        ``torch.export`` traces it (:mod:`neo.export`; the length check is eager mode's)."""
        batch = as_batch(batch)
        B, keys = batch.batch_size, batch.keys
        missing = [f for f in self.max_lengths if f not in keys]
        if missing:
            raise EmbeddingInputError(f"PositionWeights: feature '{missing[0]}' is not in the batch "
                                      f"(its features: {list(keys)})")
        dev = batch.values.device
        n = batch.values.numel()
        lengths = batch.lengths.to(torch.int64)                                    # (F * B,)
        # each batch feature's first position in the concatenated weights, and its limit (0: none)
        names = list(self.max_lengths)
        starts = [sum(self.max_lengths[g] for g in names[:names.index(f)]) if f in self.max_lengths else 0
                  for f in keys]
        limits = [self.max_lengths.get(f, 0) for f in keys]
        if not torch.compiler.is_exporting():
            self._check_lengths(lengths, keys, B, limits)
        per_feature = lengths.view(len(keys), B).sum(1)                            # (F,) ids
        feature = torch.repeat_interleave(torch.arange(len(keys), device=dev), per_feature, output_size=n)  # (N,)
        first = torch.repeat_interleave(batch.offsets.to(torch.int64)[:-1], lengths, output_size=n)        # (N,)
        position = torch.arange(n, device=dev) - first                            # (N,) place in its bag
        covered = torch.tensor([m > 0 for m in limits], device=dev)[feature]       # (N,) bool
        index = torch.tensor(starts, device=dev)[feature] + position
        table = torch.cat([self.weights[f] for f in names]).to(dev)                # (sum of max_lengths,)
        learned = table[torch.where(covered, index, torch.zeros_like(index))]     # (N,)
        other = batch.weights.to(learned.dtype) if batch.weights is not None else torch.ones_like(learned)
        weights = torch.where(covered, learned, other)
        return KeyedJaggedBatch(keys, batch.values, batch.lengths, B, weights=weights,
                                offsets=batch.offsets, validate=False)

    def _check_lengths(self, lengths: torch.Tensor, keys, B: int, limits) -> None:
        """Raise where a bag of a feature named here is longer than its ``max_length``."""
        if not B or not any(limits):
            return
        over = lengths.view(len(keys), B) > torch.tensor(limits, device=lengths.device).unsqueeze(1)
        over &= torch.tensor([m > 0 for m in limits], device=lengths.device).unsqueeze(1)
        if bool(over.any()):
            k, b = (int(i) for i in over.nonzero()[0])
            raise EmbeddingInputError(
                f"PositionWeights: feature '{keys[k]}': sample {b} has a bag of {int(lengths[k * B + b])} ids, "
                f"longer than its max_length {limits[k]} (positions 0 .. {limits[k] - 1}); raise max_length "
                f"or truncate the bags")

    def extra_repr(self) -> str:
        return f"max_lengths={self.max_lengths}"
