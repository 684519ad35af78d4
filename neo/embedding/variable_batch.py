"""Outputs of lookups on a variable-batch ``torchrec.KeyedJaggedTensor`` (VBE: a batch size
``B_f`` per feature). The modules look up the distinct bags padded to one batch size
(:func:`neo.sparse.padded_variable_batch`); these cut the result back: each sample's pooled row
taken (:func:`take_rows`), each feature's unpooled bags (:func:`own_bags`). Used by
``TableBatchedEmbedding`` and ``ShardedEmbeddingCollection`` alike."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List

import torch

if TYPE_CHECKING:
    from neo.embedding.sequence import SequenceEmbedding


def own_bags(seq: Dict[str, "SequenceEmbedding"], kjt) -> Dict[str, "SequenceEmbedding"]:
    """An unpooled lookup of a padded variable batch cut to each feature's ``B_f`` bags (the
    padding is empty bags at the end: the rows are all the feature's)."""
    from neo.embedding.sequence import SequenceEmbedding

    strides = dict(zip(kjt.keys(), kjt.stride_per_key()))
    return {f: SequenceEmbedding(s.values, s.lengths[:strides[f]]) for f, s in seq.items()}


def take_rows(pooled: torch.Tensor, cols: List[slice], rows: List[torch.Tensor]) -> torch.Tensor:
    """(B, sum of D): feature f's columns ``cols[f]`` of sample b from row ``rows[f][b]`` of
    ``pooled``. One ``index_select`` over chunks of c columns (c: the widths' common divisor),
    so that autograd's backward is one ``index_add`` (the samples sharing a row summed)."""
    n, width = pooled.shape
    B = rows[0].numel() if rows else 0
    c = 0
    for sl in cols:
        c = math.gcd(c, sl.start, sl.stop)
    c = c or width or 1
    chunks = width // c
    row_of_chunk = torch.empty(chunks, B, dtype=torch.int64, device=pooled.device)     # (chunks, B)
    for sl, r in zip(cols, rows):
        row_of_chunk[sl.start // c: sl.stop // c] = r
    index = row_of_chunk.t() * chunks + torch.arange(chunks, device=pooled.device)      # (B, chunks)
    return pooled.reshape(n * chunks, c).index_select(0, index.reshape(-1)).view(B, width)
