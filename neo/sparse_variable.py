"""Variable-batch ``torchrec.KeyedJaggedTensor`` (TorchRec's VBE: a batch size ``B_f`` per feature)
turned into :class:`~neo.sparse.KeyedJaggedBatch`: the checked parts (:func:`variable_batch_parts`),
the full batch written out (:func:`expand_variable_batch`), or the distinct bags padded to one
batch size with each feature's inverse indices (:func:`padded_variable_batch`).

The names are public in :mod:`neo.sparse` too, where users import them from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from neo.sparse import _INDEX_DTYPES, JaggedValidationError, KeyedJaggedBatch, is_variable_batch, offsets_from_lengths

__all__ = ["VariableBatch", "expand_variable_batch", "is_variable_batch", "padded_variable_batch",
           "variable_batch_parts"]


@dataclass
class VariableBatch:
    """A variable-batch KJT's parts, checked (:func:`variable_batch_parts`)."""

    keys: List[str]
    strides: List[int]
    """B_f, bags of each feature, in key order."""
    first: List[int]
    """Index of each feature's first bag in ``lengths``; F + 1 entries."""
    inverse: List[torch.Tensor]
    """(B,) int64 per feature, in key order: the feature's bag that each sample reads."""
    batch_size: int
    """B, samples of the full batch."""


def variable_batch_parts(kjt) -> VariableBatch:
    """The parts of a variable-batch ``torchrec.KeyedJaggedTensor`` (TorchRec's VBE).

    Feature ``f`` holds ``B_f`` bags (its ``stride_per_key()``; e.g. one bag per distinct user in a
    batch of requests) and ``inverse_indices()`` = ``(keys, (F, B) tensor)`` says which of them
    sample ``b`` reads: bag ``(f, b)`` of the full batch is bag ``inverse[f, b]`` of feature ``f``.
    ValueError naming the feature: no inverse indices, a feature missing from them, an index
    outside the feature's ``B_f`` bags."""
    keys = list(kjt.keys())
    inverse = kjt.inverse_indices_or_none() if hasattr(kjt, "inverse_indices_or_none") else None
    if inverse is None:
        raise ValueError("a variable-batch KeyedJaggedTensor (a batch size per feature) needs its inverse_indices "
                         "(keys, (F, B) tensor: which of a feature's bags each sample reads) to be looked up")
    inv_keys, inv = list(inverse[0]), inverse[1]
    if not isinstance(inv, torch.Tensor) or inv.dim() != 2 or inv.size(0) != len(inv_keys):
        raise ValueError(f"inverse_indices: expected (keys, ({len(inv_keys)}, B) tensor), got a tensor of shape "
                         f"{tuple(getattr(inv, 'shape', ()))}")
    B = int(inv.size(1))
    strides = [int(x) for x in kjt.stride_per_key()]
    if kjt.lengths().numel() != sum(strides):
        raise JaggedValidationError(f"a variable-batch KeyedJaggedTensor with {sum(strides)} bags "
                                    f"(stride_per_key {strides}) has {kjt.lengths().numel()} lengths")
    first = [0]
    for n in strides:
        first.append(first[-1] + n)
    negative = (kjt.lengths() < 0).nonzero()
    if negative.numel():
        at = int(negative[0])
        f = next(k for k in range(len(keys)) if first[k + 1] > at)
        raise JaggedValidationError(f"feature {keys[f]!r}: bag {at - first[f]} of a variable-batch KeyedJaggedTensor "
                                    f"has the negative length {int(kjt.lengths()[at])}")
    rows_of = []
    for f, key in enumerate(keys):
        if key not in inv_keys:
            raise ValueError(f"feature {key!r}: not in the KeyedJaggedTensor's inverse_indices (keys {inv_keys})")
        rows = inv[inv_keys.index(key)].to(torch.int64)
        if B and (int(rows.min()) < 0 or int(rows.max()) >= strides[f]):
            bad = int(((rows < 0) | (rows >= strides[f])).nonzero()[0])
            raise ValueError(f"feature {key!r}: inverse_indices[{inv_keys.index(key)}, {bad}] = {int(rows[bad])} "
                             f"is outside its {strides[f]} bags")
        rows_of.append(rows)
    return VariableBatch(keys, strides, first, rows_of, B)


def expand_variable_batch(kjt, validate: bool = True) -> KeyedJaggedBatch:
    """A variable-batch ``torchrec.KeyedJaggedTensor`` as the full batch of B samples it stands
    for (:func:`variable_batch_parts`): every sample's bag written out, so the lookups are those
    of the full batch (what :func:`~neo.sparse.as_batch` and a sharded collection's ``input_dist`` stage
    make of one). The modules' ``forward`` and ``sequence`` look up the distinct bags instead
    (:func:`padded_variable_batch`)."""
    parts = variable_batch_parts(kjt)
    lengths = kjt.lengths().to(torch.int64)
    values, weights = kjt.values(), kjt.weights_or_none()
    src = torch.cat([r + parts.first[f] for f, r in enumerate(parts.inverse)]) if parts.inverse \
        else torch.zeros(0, dtype=torch.int64, device=lengths.device)              # (F * B,) bag in the KJT
    offsets = offsets_from_lengths(lengths)
    out_lengths = lengths[src]                                                     # (F * B,)
    out_values, out_weights, out_offsets = _take_bags(values, weights, offsets, src, out_lengths)
    return KeyedJaggedBatch(tuple(parts.keys), out_values, out_lengths.to(kjt.lengths().dtype), parts.batch_size,
                            weights=out_weights, offsets=out_offsets, validate=validate)


def _take_bags(values: torch.Tensor, weights: Optional[torch.Tensor], offsets: torch.Tensor, src: torch.Tensor,
               out_lengths: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """(values, weights, offsets) of bags ``src`` (with lengths ``out_lengths``) of a jagged
    layout: on the CPU by ``neo._C.jagged_take`` (one pass; 3.2x faster than the torch ops below
    at 688k ids, tools/bench_vbe.py), elsewhere by a gather of positions."""
    from neo.cpp import cpu_kernels

    _C = cpu_kernels("jagged_take") if values.device.type == "cpu" and values.dtype in _INDEX_DTYPES else None
    if _C is not None and src.numel():
        zeros = torch.zeros(src.numel(), dtype=torch.int64).numpy()
        source = values if weights is None else torch.arange(values.numel(), dtype=torch.int64)
        taken, out_offsets = _C.jagged_take([source.contiguous().numpy()], [offsets.numpy()], zeros, src.numpy())
        if weights is None:
            return taken, None, out_offsets
        return values[taken], weights[taken], out_offsets
    out_offsets = offsets_from_lengths(out_lengths)
    n = int(out_offsets[-1])
    take = torch.repeat_interleave(offsets[:-1][src] - out_offsets[:-1], out_lengths, output_size=n) + \
        torch.arange(n, dtype=torch.int64, device=values.device)                  # (n,) position in values
    return values[take], None if weights is None else weights[take], out_offsets


def padded_variable_batch(kjt, validate: bool = True, pad_to: Optional[int] = None,
                          parts: Optional[VariableBatch] = None) -> Tuple[KeyedJaggedBatch, Dict[str, torch.Tensor]]:
    """A variable-batch ``torchrec.KeyedJaggedTensor``'s distinct bags as a batch of
    ``pad_to`` (default ``max_f B_f``) samples (feature ``f``'s ``B_f`` bags, then empty ones:
    the values and weights unchanged), and each feature's (B,) inverse indices into it: the full
    batch's pooled embeddings are the padded batch's rows ``inverse[f]`` in feature ``f``'s
    columns, and feature ``f``'s own bags its first ``B_f``. ``parts``: :func:`variable_batch_parts`
    of ``kjt`` where the caller has them already."""
    parts = parts if parts is not None else variable_batch_parts(kjt)
    Bp = max(parts.strides, default=0) if pad_to is None else int(pad_to)
    if Bp < max(parts.strides, default=0):
        raise ValueError(f"pad_to {Bp} is below a feature's {max(parts.strides)} bags")
    lengths = kjt.lengths()
    pieces = []
    for f, n in enumerate(parts.strides):
        pieces.append(lengths[parts.first[f]:parts.first[f + 1]])
        if n < Bp:
            pieces.append(lengths.new_zeros(Bp - n))
    padded = torch.cat(pieces) if pieces else lengths[:0]
    batch = KeyedJaggedBatch(tuple(parts.keys), kjt.values(), padded, Bp, weights=kjt.weights_or_none(),
                             validate=validate)
    return batch, dict(zip(parts.keys, parts.inverse))
