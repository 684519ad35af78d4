"""Pooled embeddings keyed by feature: TorchRec's ``KeyedTensor`` and its ``regroup``, for the
``(B, sum of D)`` output of a :class:`~neo.embedding.TableBatchedEmbedding` or a
:class:`~neo.distributed.ShardedEmbeddingCollection` (also importable from :mod:`neo.sparse`)."""

from __future__ import annotations

from typing import Dict, List, Protocol, Sequence, Tuple

import torch

__all__ = ["KeyedEmbeddings", "regroup"]


class _HasFeatureSlices(Protocol):
    def feature_slices(self) -> Dict[str, slice]: ...


class KeyedEmbeddings:
    """Pooled embeddings ``(B, sum of D)`` with each feature's columns named (TorchRec's ``KeyedTensor``).

    Example: a module with features ``user`` (D 16) and ``item`` (D 8)::

        kt = KeyedEmbeddings.of(emb, emb(batch))      # or emb.keyed(batch)
        kt.keys()             # ["user", "item"]
        kt.length_per_key()   # [16, 8]
        kt.offset_per_key()   # [0, 16, 24]
        kt["item"]            # (B, 8) view of columns 16:24
        kt.to_dict()          # {"user": (B, 16) view, "item": (B, 8) view}
        kt.regroup([["item", "user"], ["user"]])   # [(B, 24) cat of item, user; (B, 16)]

    Views and regrouped tensors carry the autograd graph: a loss on them trains the tables as
    the same loss on the full output would.

    Args:
        keys: feature names, in column order (distinct).
        length_per_key: each feature's number of columns (D).
        values: ``(B, sum of length_per_key)``.
    """

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: torch.Tensor):
        keys, lengths = list(keys), [int(n) for n in length_per_key]
        if len(set(keys)) != len(keys):
            raise ValueError(f"KeyedEmbeddings: keys repeat: {keys}")
        if len(lengths) != len(keys) or any(n < 0 for n in lengths):
            raise ValueError(f"KeyedEmbeddings: {len(keys)} keys need as many lengths >= 0, got {lengths}")
        if values.dim() != 2 or values.shape[1] != sum(lengths):
            raise ValueError(f"KeyedEmbeddings: values must be (B, {sum(lengths)}) (the sum of the lengths "
                             f"{lengths}), got {tuple(values.shape)}")
        self._keys, self._lengths, self._values = keys, lengths, values
        self._offsets = [0]
        for n in lengths:
            self._offsets.append(self._offsets[-1] + n)
        self._index = {k: i for i, k in enumerate(keys)}

    @classmethod
    def of(cls, module: _HasFeatureSlices, output: torch.Tensor) -> "KeyedEmbeddings":
        """``output`` (B, sum of D) of ``module`` (a TableBatchedEmbedding or a
        ShardedEmbeddingCollection: anything with ``feature_slices()``), keyed by its features."""
        slices = module.feature_slices()
        keys = sorted(slices, key=lambda f: slices[f].start)
        c = 0
        for k in keys:
            if slices[k].start != c:
                raise ValueError(f"KeyedEmbeddings.of: feature '{k}' starts at column {slices[k].start}, not {c}: "
                                 "the features' columns must tile the output")
            c = slices[k].stop
        return cls(keys, [slices[k].stop - slices[k].start for k in keys], output)

    def keys(self) -> List[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        """The ``(B, sum of D)`` tensor itself."""
        return self._values

    def length_per_key(self) -> List[int]:
        return list(self._lengths)

    def offset_per_key(self) -> List[int]:
        """Each feature's first column, then the total (F + 1 values)."""
        return list(self._offsets)

    def _columns(self, key: str) -> Tuple[int, int]:
        i = self._index.get(key)
        if i is None:
            raise KeyError(f"no feature '{key}' here; features: {self._keys}")
        return self._offsets[i], self._lengths[i]

    def __getitem__(self, key: str) -> torch.Tensor:
        """Feature ``key``'s ``(B, D)`` columns (a view)."""
        start, n = self._columns(key)
        return self._values.narrow(1, start, n)

    def to_dict(self) -> Dict[str, torch.Tensor]:
        """``{feature: (B, D) view}`` in column order."""
        return {k: self[k] for k in self._keys}

    def regroup(self, groups: Sequence[Sequence[str]]) -> List[torch.Tensor]:
        """One ``(B, sum of the group's D)`` tensor per group: its features' columns side by
        side in the order named (:func:`regroup` of this one)."""
        return regroup([self], groups)

    def __repr__(self) -> str:
        return f"KeyedEmbeddings(keys={self._keys}, length_per_key={self._lengths}, values={tuple(self._values.shape)})"


def regroup(keyed: Sequence[KeyedEmbeddings], groups: Sequence[Sequence[str]]) -> List[torch.Tensor]:
    """TorchRec's ``KeyedTensor.regroup``: for each group (feature names, from any of ``keyed``),
    the ``(B, sum of D)`` concatenation of those features' columns in the order named. A group
    whose columns are contiguous in one source is a view of it, the others new tensors; both
    carry gradients back to the sources. KeyError naming an unknown feature, ValueError for a
    feature in two sources or sources of different batch sizes."""
    keyed = list(keyed)
    owner: Dict[str, KeyedEmbeddings] = {}
    for kt in keyed:
        for k in kt.keys():
            if k in owner:
                raise ValueError(f"regroup: feature '{k}' is in two of the keyed embeddings")
            owner[k] = kt
    sizes = {kt.values().shape[0] for kt in keyed}
    if len(sizes) > 1:
        raise ValueError(f"regroup: the keyed embeddings have different batch sizes: {sorted(sizes)}")
    out = []
    for group in groups:
        runs: List[Tuple[KeyedEmbeddings, int, int]] = []          # (source, first column, width)
        for k in group:
            if k not in owner:
                raise KeyError(f"regroup: no feature '{k}'; features: {list(owner)}")
            start, n = owner[k]._columns(k)
            if runs and runs[-1][0] is owner[k] and runs[-1][1] + runs[-1][2] == start:
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + n)   # adjacent columns: one run
            else:
                runs.append((owner[k], start, n))
        pieces = [kt.values().narrow(1, start, n) for kt, start, n in runs]
        if not pieces:
            raise ValueError("regroup: an empty group")
        out.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1))
    return out
