"""Keyed jagged batch: the currency between data, kernels and the distributed runtime.

A batch of ``B`` samples with ``F`` sparse features stores, for every (feature, sample)
pair, a variable-length *bag* of ids. All bags are laid out flat, feature-major
(every sample of feature 0, then every sample of feature 1, ...), the same layout as
TorchRec's ``KeyedJaggedTensor``.

Worked example: keys ``["user", "item"]``, batch size ``B = 3``::

    sample        0        1      2
    "user"     [10, 11]   []     [12]
    "item"     [7]        [8, 9] []

    keys    = ("user", "item")
    values  = [10, 11, 12,  7, 8, 9]        # (N,)  N = 6 ids in all
    lengths = [2, 0, 1,     1, 2, 0]        # (F * B,)  bag sizes, feature-major
    offsets = [0, 2, 2, 3,  4, 6, 6]        # (F * B + 1,)  cumsum of lengths, starts at 0
    weights = None or a float tensor of shape (N,), one weight per id

Bag ``(f, b)`` holds ``values[offsets[f * B + b] : offsets[f * B + b + 1]]``.

Construction validates the layout (string keys, an integer batch size, dtypes, shapes,
non-negative lengths, offsets that start at 0, stay within [0, N], never decrease and end
at N, lengths that match offsets) and names the offending feature; pass ``validate=False``
to skip the checks on a hot path whose input is already known to be good. A batch remembers
that it passed them (and so do the batches ``to``, ``pin_memory`` and ``permute`` derive from
it): :meth:`KeyedJaggedBatch.ensure_checked` checks only those that did not.

A variable-batch ``torchrec.KeyedJaggedTensor`` (VBE: a batch size per feature) becomes a batch
by the helpers in :mod:`neo.sparse_variable` (:func:`expand_variable_batch`,
:func:`padded_variable_batch`, ...); their names are importable from here as well.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.utils._pytree

if TYPE_CHECKING:   # at run time these load on first use: __getattr__ at the end of this module
    from neo.sparse_variable import expand_variable_batch, padded_variable_batch, variable_batch_parts

__all__ = ["KeyedJaggedBatch", "JaggedValidationError", "KeyedEmbeddings", "as_batch", "concat_features",
           "expand_variable_batch", "is_variable_batch", "offsets_from_lengths", "padded_variable_batch", "regroup",
           "variable_batch_parts"]

_INDEX_DTYPES = (torch.int32, torch.int64)


class JaggedValidationError(ValueError):
    """A keyed jagged batch whose layout is inconsistent."""


def _feature_of(position: int, keys: Sequence[str], batch_size: int) -> str:
    if batch_size <= 0 or not keys:
        return "?"
    return keys[min(position // batch_size, len(keys) - 1)]


def is_variable_batch(batch) -> bool:
    """Whether ``batch`` is a variable-batch ``torchrec.KeyedJaggedTensor`` (VBE)."""
    return type(batch).__name__ == "KeyedJaggedTensor" and bool(getattr(batch, "variable_stride_per_key",
                                                                         lambda: False)())


@dataclass
class KeyedJaggedBatch:
    """Sparse features of one batch in the flat, feature-major jagged layout (see module doc).

    Attributes:
        keys: feature names, in layout order (F of them).
        values: ids, int64 or int32, shape (N,).
        lengths: bag sizes, shape (F * B,), feature-major.
        batch_size: B, samples in the batch.
        weights: optional per-id weights, floating point, shape (N,).
        offsets: (F * B + 1,) exclusive cumulative sum of ``lengths``; derived when omitted.
    """

    keys: Tuple[str, ...]
    values: torch.Tensor
    lengths: torch.Tensor
    batch_size: int
    weights: Optional[torch.Tensor] = None
    offsets: Optional[torch.Tensor] = None
    validate: bool = field(default=True, repr=False)
    _checked: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.keys, (str, bytes)):
            raise JaggedValidationError(f"keys must be a sequence of feature names, got the string {self.keys!r}")
        self.keys = tuple(self.keys)
        if self.offsets is None:
            if self.validate:
                self._check_lengths()
            self.offsets = offsets_from_lengths(self.lengths)
        if self.validate:
            self.check()

    # ------------------------------------------------------------------ checks
    def _check_lengths(self) -> None:
        if not isinstance(self.lengths, torch.Tensor) or self.lengths.dtype not in _INDEX_DTYPES:
            raise JaggedValidationError(
                f"lengths must be an int32 or int64 tensor, got {getattr(self.lengths, 'dtype', type(self.lengths))}"
            )
        if self.lengths.dim() != 1:
            raise JaggedValidationError(f"lengths must be 1-D, got shape {tuple(self.lengths.shape)}")

    def check(self) -> None:
        """Validate the layout; raise :class:`JaggedValidationError` naming the feature at fault."""
        keys = self.keys
        bad_keys = [k for k in keys if not isinstance(k, str)]
        if bad_keys:
            raise JaggedValidationError(f"keys must be feature names (strings), got {bad_keys[0]!r} in {list(keys)}")
        if len(set(keys)) != len(keys):
            raise JaggedValidationError(f"duplicate feature keys: {list(keys)}")
        try:
            if isinstance(self.batch_size, bool):
                raise TypeError
            self.batch_size = operator.index(self.batch_size)
        except TypeError:
            raise JaggedValidationError(f"batch_size must be an integer, got {self.batch_size!r}") from None
        B = self.batch_size
        if B < 0:
            raise JaggedValidationError(f"batch_size must be >= 0, got {B}")
        if not isinstance(self.values, torch.Tensor) or self.values.dtype not in _INDEX_DTYPES:
            raise JaggedValidationError(
                f"values (ids) must be an int32 or int64 tensor, got {getattr(self.values, 'dtype', type(self.values))}"
            )
        if self.values.dim() != 1:
            raise JaggedValidationError(f"values must be 1-D, got shape {tuple(self.values.shape)}")
        self._check_lengths()
        n_bags = len(keys) * B
        if self.lengths.numel() != n_bags:
            raise JaggedValidationError(
                f"lengths has {self.lengths.numel()} entries, expected F * B = {len(keys)} * {B} = {n_bags}"
            )
        offsets = self.offsets
        if not isinstance(offsets, torch.Tensor):
            raise JaggedValidationError(f"offsets must be a tensor, got {type(offsets).__name__}")
        if offsets.dtype not in _INDEX_DTYPES or offsets.dim() != 1 or offsets.numel() != n_bags + 1:
            raise JaggedValidationError(
                f"offsets must be a 1-D integer tensor of F * B + 1 = {n_bags + 1} entries, "
                f"got dtype {offsets.dtype} shape {tuple(offsets.shape)}"
            )
        if n_bags:
            neg = (self.lengths < 0).nonzero()
            if neg.numel():
                p = int(neg[0])
                raise JaggedValidationError(
                    f"feature '{_feature_of(p, keys, B)}': negative length {int(self.lengths[p])} at sample {p % B}"
                )
        if int(offsets[0]) != 0:
            raise JaggedValidationError(f"offsets must start at 0, got {int(offsets[0])}")
        steps = offsets[1:] - offsets[:-1]
        bad = (steps < 0).nonzero()
        if bad.numel():
            p = int(bad[0])
            raise JaggedValidationError(
                f"feature '{_feature_of(p, keys, B)}': offsets decrease at sample {p % B} "
                f"({int(offsets[p])} -> {int(offsets[p + 1])})"
            )
        if int(offsets[-1]) != self.values.numel():
            raise JaggedValidationError(
                f"offsets end at {int(offsets[-1])} but there are {self.values.numel()} ids (values)"
            )
        # out of [0, N]: lengths whose sum wraps around int64 back to N
        outside = ((offsets < 0) | (offsets > self.values.numel())).nonzero()
        if outside.numel():
            p = int(outside[0])
            raise JaggedValidationError(
                f"feature '{_feature_of(max(p - 1, 0), keys, B)}': offset {int(offsets[p])} at sample "
                f"{max(p - 1, 0) % max(B, 1)} is outside [0, {self.values.numel()}] (the ids in values)"
            )
        mismatch = (steps != self.lengths.to(steps.dtype)).nonzero()
        if mismatch.numel():
            p = int(mismatch[0])
            raise JaggedValidationError(
                f"feature '{_feature_of(p, keys, B)}': lengths[{p}] = {int(self.lengths[p])} does not match "
                f"offsets ({int(steps[p])} ids) at sample {p % B}"
            )
        if self.weights is not None:
            w = self.weights
            if not isinstance(w, torch.Tensor) or not w.is_floating_point():
                raise JaggedValidationError("weights must be a floating-point tensor")
            if w.shape != self.values.shape:
                raise JaggedValidationError(
                    f"weights has shape {tuple(w.shape)}, expected one weight per id {tuple(self.values.shape)}"
                )
        self._checked = True

    def ensure_checked(self) -> None:
        """:meth:`check` unless this batch passed it already (at construction, or a batch it was
        derived from by ``to``, ``pin_memory`` or ``permute``)."""
        if not self._checked:
            self.check()

    def _derived(self, out: "KeyedJaggedBatch") -> "KeyedJaggedBatch":
        out._checked = self._checked
        return out

    # --------------------------------------------------------------- accessors
    @property
    def num_features(self) -> int:
        return len(self.keys)

    def length_per_key(self) -> List[int]:
        """Number of ids of each feature, in key order."""
        B = self.batch_size
        return [int(self.offsets[(f + 1) * B] - self.offsets[f * B]) for f in range(len(self.keys))]

    def offset_per_key(self) -> List[int]:
        """Start of each feature's ids in ``values``, plus N at the end (F + 1 entries)."""
        B = self.batch_size
        return [int(self.offsets[f * B]) for f in range(len(self.keys) + 1)]

    def feature(self, key: str) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(values, lengths, weights) of one feature."""
        f = self.keys.index(key)
        B = self.batch_size
        lo, hi = int(self.offsets[f * B]), int(self.offsets[(f + 1) * B])
        w = None if self.weights is None else self.weights[lo:hi]
        return self.values[lo:hi], self.lengths[f * B : (f + 1) * B], w

    def to_dict(self) -> Dict[str, List[List[int]]]:
        """{key: [bag of sample 0, bag of sample 1, ...]} as Python lists (for tests and debugging)."""
        out: Dict[str, List[List[int]]] = {}
        for key in self.keys:
            values, lengths, _ = self.feature(key)
            out[key] = [v.tolist() for v in torch.split(values, lengths.tolist())]
        return out

    # ----------------------------------------------------------- constructors
    @classmethod
    def from_lists(
        cls,
        bags: Dict[str, Sequence[Sequence[int]]],
        weights: Optional[Dict[str, Sequence[Sequence[float]]]] = None,
    ) -> "KeyedJaggedBatch":
        """Build from ``{key: [bag per sample]}``; every key must list the same number of samples."""
        keys = list(bags)
        sizes = {len(v) for v in bags.values()}
        if len(sizes) > 1:
            raise JaggedValidationError(f"features list different numbers of samples: { {k: len(v) for k, v in bags.items()} }")
        B = sizes.pop() if sizes else 0
        flat = [i for k in keys for bag in bags[k] for i in bag]
        lengths = [len(bag) for k in keys for bag in bags[k]]
        w = None
        if weights is not None:
            w = torch.tensor([x for k in keys for bag in weights[k] for x in bag], dtype=torch.float32)
        return cls(
            keys=tuple(keys),
            values=torch.tensor(flat, dtype=torch.int64),
            lengths=torch.tensor(lengths, dtype=torch.int64),
            batch_size=B,
            weights=w,
        )

    # ---------------------------------------------------------- transforms
    def permute(self, keys: Sequence[str]) -> "KeyedJaggedBatch":
        """A batch holding only ``keys``, in that order (a key may not repeat)."""
        keys = list(keys)
        if keys == list(self.keys):
            return self
        missing = [k for k in keys if k not in self.keys]
        if missing:
            raise KeyError(f"features {missing} are not in the batch (it has {list(self.keys)})")
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"permute: features {repeated} are given more than once")
        B = self.batch_size
        idx = [self.keys.index(k) for k in keys]
        starts = self.offset_per_key()
        pieces_v, pieces_w, pieces_l = [], [], []
        for f in idx:
            pieces_v.append(self.values[starts[f] : starts[f + 1]])
            pieces_l.append(self.lengths[f * B : (f + 1) * B])
            if self.weights is not None:
                pieces_w.append(self.weights[starts[f] : starts[f + 1]])
        values = torch.cat(pieces_v) if pieces_v else self.values[:0]
        lengths = torch.cat(pieces_l) if pieces_l else self.lengths[:0]
        weights = torch.cat(pieces_w) if self.weights is not None and pieces_w else None
        return self._derived(KeyedJaggedBatch(tuple(keys), values, lengths, B, weights=weights, validate=False))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "KeyedJaggedBatch":
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return self._derived(KeyedJaggedBatch(
            self.keys, move(self.values), move(self.lengths), self.batch_size,
            weights=move(self.weights), offsets=move(self.offsets), validate=False,
        ))

    def pin_memory(self) -> "KeyedJaggedBatch":
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return self._derived(KeyedJaggedBatch(
            self.keys, pin(self.values), pin(self.lengths), self.batch_size,
            weights=pin(self.weights), offsets=pin(self.offsets), validate=False,
        ))

    # ------------------------------------------------------------ torchrec
    def to_torchrec(self):
        """Convert to ``torchrec.KeyedJaggedTensor`` (requires torchrec)."""
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        return KeyedJaggedTensor(
            keys=list(self.keys), values=self.values, lengths=self.lengths,
            offsets=self.offsets, weights=self.weights, stride=self.batch_size,   # (a batch of no features too)
        )

    @classmethod
    def from_torchrec(cls, kjt, validate: bool = True) -> "KeyedJaggedBatch":
        """Convert from a ``torchrec.KeyedJaggedTensor`` (its stride is the batch size). A
        variable-batch KJT (TorchRec's VBE: a batch size per feature, ``stride_per_key_per_rank``)
        with its ``inverse_indices`` is expanded to the full batch (:func:`expand_variable_batch`)."""
        if is_variable_batch(kjt):
            from neo.sparse_variable import expand_variable_batch

            return expand_variable_batch(kjt, validate=validate)
        return cls(
            keys=tuple(kjt.keys()), values=kjt.values(), lengths=kjt.lengths(),
            batch_size=kjt.stride(), weights=kjt.weights_or_none(), offsets=kjt.offsets(),
            validate=validate,
        )


def as_batch(batch) -> "KeyedJaggedBatch":
    """``batch`` as a :class:`KeyedJaggedBatch`: itself, or a ``torchrec.KeyedJaggedTensor``
    converted (:meth:`KeyedJaggedBatch.from_torchrec`, the tensors shared), so that modules take
    what a TorchRec user passes (a variable-batch KJT expanded to its full batch:
    :func:`expand_variable_batch`). TypeError for anything else."""
    if isinstance(batch, KeyedJaggedBatch):
        return batch
    if type(batch).__name__ == "KeyedJaggedTensor" and hasattr(batch, "stride"):
        return KeyedJaggedBatch.from_torchrec(batch)
    raise TypeError(f"expected a neo.sparse.KeyedJaggedBatch (or a torchrec KeyedJaggedTensor), "
                    f"got {type(batch).__module__}.{type(batch).__name__}")


def offsets_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """(n + 1,) int64 offsets, 0 first, of ``n`` segment lengths."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return offsets


def concat_features(batches: Iterable[KeyedJaggedBatch]) -> KeyedJaggedBatch:
    """Concatenate batches with disjoint keys and the same batch size, feature-wise."""
    batches = list(batches)
    if not batches:
        raise JaggedValidationError("concat_features needs at least one batch (their batch size is the result's)")
    B = batches[0].batch_size
    if any(b.batch_size != B for b in batches):
        raise JaggedValidationError("concat_features needs equal batch sizes")
    has_w = [b.weights is not None for b in batches]
    weights = None
    if any(has_w):
        weights = torch.cat([b.weights if b.weights is not None else torch.ones_like(b.values, dtype=torch.float32) for b in batches])
    return KeyedJaggedBatch(
        tuple(k for b in batches for k in b.keys),
        torch.cat([b.values for b in batches]),
        torch.cat([b.lengths for b in batches]),
        B, weights=weights,
    )


def _flatten(batch: KeyedJaggedBatch):
    # lengths as (F, B): B is then a dimension of an input, not a quotient (torch.export can let it be
    # 1). A copy, not a view (export would trace a view from its base, of static shape), made once per
    # batch: export finds an input's dynamic dimensions by the tensor's identity across flattenings
    cached = batch.__dict__.get("_lengths_fb")
    if cached is None or cached[0] is not batch.lengths:
        cached = (batch.lengths, batch.lengths.view(len(batch.keys), batch.batch_size).clone())
        batch.__dict__["_lengths_fb"] = cached
    return [batch.values, cached[1], batch.offsets, batch.weights], list(batch.keys)


def _unflatten(children, keys) -> KeyedJaggedBatch:
    values, lengths, offsets, weights = children
    return KeyedJaggedBatch(tuple(keys), values, lengths.reshape(-1), lengths.shape[1], weights=weights,
                            offsets=offsets, validate=False)


def _flatten_with_keys(batch: KeyedJaggedBatch):
    children, keys = _flatten(batch)
    names = ("values", "lengths", "offsets", "weights")
    return [(torch.utils._pytree.GetAttrKey(n), c) for n, c in zip(names, children)], keys


# A pytree node, as TorchRec's KeyedJaggedTensor: torch.export takes a batch as an input (its
# tensors the program's inputs, the keys its structure), and a saved
# program's example batch loads with torch.load's weights_only (neo/export.py).
torch.utils._pytree.register_pytree_node(KeyedJaggedBatch, _flatten, _unflatten,
                                         flatten_with_keys_fn=_flatten_with_keys,
                                         serialized_type_name="neo.sparse.KeyedJaggedBatch")
torch.serialization.add_safe_globals([KeyedJaggedBatch])


# The pooled output keyed by feature (TorchRec's KeyedTensor) lives in neo.keyed_embeddings; its
# names stay public here, where the docs and users' code import them from.
from neo.keyed_embeddings import KeyedEmbeddings, regroup  # noqa: E402


# The variable-batch (VBE) helpers live in neo.sparse_variable, which imports this module; their
# names stay public here, loaded on first use (PEP 562): an import at the end of this module would
# fail when neo.sparse_variable is the one imported first.
_VARIABLE_BATCH_NAMES = ("VariableBatch", "expand_variable_batch", "padded_variable_batch",
                         "variable_batch_parts")


def __getattr__(name: str):
    if name in _VARIABLE_BATCH_NAMES:
        import neo.sparse_variable

        value = getattr(neo.sparse_variable, name)
        globals()[name] = value     # later look-ups skip this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_VARIABLE_BATCH_NAMES))
