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

Bad input: a bag longer than its feature's ``max_length`` raises, naming the feature, the sample
and the length (TorchRec's gather would fail on an index out of range). Features of the batch
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
        ``weights[f][position]`` for every feature named here, the batch's own (or 1) elsewhere."""
        batch = as_batch(batch)
        B, F = batch.batch_size, len(batch.keys)
        missing = [f for f in self.max_lengths if f not in batch.keys]
        if missing:
            raise EmbeddingInputError(f"PositionWeights: feature '{missing[0]}' is not in the batch "
                                      f"(its features: {list(batch.keys)})")
        lengths = batch.lengths.to(torch.int64)
        offsets = batch.offsets.to(torch.int64)
        n = batch.values.numel()
        # (N,) position of each id in its bag: its index minus its bag's first
        starts = torch.repeat_interleave(offsets[:-1], lengths, output_size=n)
        position = torch.arange(n, dtype=torch.int64, device=batch.values.device) - starts
        bounds = offsets[::B].tolist() if B else [0] * (F + 1)                      # (F + 1,) each feature's ids
        pieces = []
        for k, f in enumerate(batch.keys):
            lo, hi = bounds[k], bounds[k + 1]
            if f not in self.max_lengths:
                own = batch.weights[lo:hi] if batch.weights is not None else None
                pieces.append(own.to(torch.float32) if own is not None
                              else torch.ones(hi - lo, dtype=torch.float32, device=batch.values.device))
                continue
            bags = lengths[k * B:(k + 1) * B]
            limit = self.max_lengths[f]
            if B and int(bags.max()) > limit:
                b = int((bags > limit).nonzero()[0])
                raise EmbeddingInputError(
                    f"PositionWeights: feature '{f}': sample {b} has a bag of {int(bags[b])} ids, longer than its "
                    f"max_length {limit} (positions 0 .. {limit - 1}); raise max_length or truncate the bags")
            w = self.weights[f]
            pieces.append(w.to(batch.values.device)[position[lo:hi]])
        weights = torch.cat(pieces) if pieces else torch.ones(0, device=batch.values.device)
        return KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, B, weights=weights,
                                offsets=batch.offsets, validate=False)

    def extra_repr(self) -> str:
        return f"max_lengths={self.max_lengths}"
