"""Embedding lookups under torch.func's transforms (``grad``, ``jvp``, ``vmap``, ``hessian``).

There a lookup is a constant of the transformed function: the same pooled rows as outside, no
gradient to the tables, no fused optimizer step (a transform differentiates; it does not train).
The modules (``TableBatchedEmbedding``, ``ShardedEmbeddingCollection``: pooled and unpooled
lookups) run it outside the transforms (:func:`outside_transforms`: functorch's interpreter stack
set aside, grad mode off), where their kernels, autograd Functions and collectives run as in
evaluation, on the batch with functorch's wrappers of constants taken off
(:func:`plain_for_transform`). Ids, lengths or per-id weights that the transform batches or
differentiates are refused, naming the tables: their derivative would be dropped.

Under ``torch.compile`` a lookup is one opaque step of the model: Dynamo runs it eagerly
(``torch._disable_dynamo``) instead of tracing into the modules' Python, where every batch's
new id count recompiled three frames and the graphs were cut at the autograd Functions anyway;
the dense layers around it are compiled (the dot interaction as one custom op,
neo/models/traced_ops.py). The modules' lookup methods say both with one decorator,
:func:`lookup_method`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, Iterator, Optional, Sequence, TypeVar

import torch

from neo.embedding.checks import EmbeddingInputError
from neo.sparse import as_batch, is_variable_batch


@contextlib.contextmanager
def outside_transforms() -> Iterator[None]:
    """The block runs as plain eager code without grad mode: no functorch wrappers on what it
    makes (the kernels write their outputs), no autograd Function sees a transform."""
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

    with temporarily_clear_interpreter_stack(), torch.no_grad():
        yield


def _plain(what: str, t: Optional[torch.Tensor], tables: Sequence[str]) -> Optional[torch.Tensor]:
    """``t`` without functorch's wrappers where it is a constant of the transform (a tensor made
    inside the transformed function); EmbeddingInputError where the transform batches or
    differentiates it."""
    from torch._C._functorch import get_unwrapped, is_batchedtensor, is_functorch_wrapped_tensor

    while t is not None:
        if is_batchedtensor(t) or t.requires_grad:
            raise EmbeddingInputError(
                f"{what} of the lookup into {', '.join(tables)} are "
                f"{'batched' if is_batchedtensor(t) else 'differentiated'} by a torch.func transform: under "
                f"torch.func (grad, jvp, vmap, hessian) the lookup runs as a constant of the function (its rows; "
                f"no gradient to the tables and no optimizer step), so its inputs must be constants of the "
                f"function; look up outside the transform and pass the pooled embeddings in "
                f"(e.g. DLRM.head(dense, pooled))")
        if not is_functorch_wrapped_tensor(t):
            return t
        t = get_unwrapped(t)
    return t


def plain_for_transform(batch, tables: Sequence[str]):
    """``batch`` (a KeyedJaggedBatch or a TorchRec KJT) for a lookup under a transform: a
    KeyedJaggedBatch of plain tensors; a variable-batch KJT is checked and passed as it is."""
    if is_variable_batch(batch):
        for what, t in (("ids", batch.values()), ("lengths", batch.lengths()),
                        ("per-id weights", batch.weights_or_none())):
            _plain(what, t, tables)
        return batch
    b = as_batch(batch)
    return dataclasses.replace(
        b, values=_plain("ids", b.values, tables), lengths=_plain("lengths", b.lengths, tables),
        weights=_plain("per-id weights", b.weights, tables), offsets=_plain("offsets", b.offsets, tables))


M = TypeVar("M", bound=Callable)


def constant_under_transforms(method: M) -> M:
    """A module's lookup method ``method(self, batch, ...)`` (``self.tables``: its TableConfigs),
    run under a transform as a constant of the function: on the batch and any tensor arguments
    (``pooled_bags``) made plain, outside the transforms. Elsewhere it runs as it is (one test,
    about 50 ns)."""

    @functools.wraps(method)
    def lookup(self, batch, *args, **kwargs):
        if not torch._C._are_functorch_transforms_active():
            return method(self, batch, *args, **kwargs)
        names = [t.name for t in self.tables]
        plain = lambda k, a: _plain(k, a, names) if isinstance(a, torch.Tensor) else a  # noqa: E731
        args = [plain("flags", a) for a in args]
        kwargs = {k: plain(k, a) for k, a in kwargs.items()}
        with outside_transforms():
            return method(self, plain_for_transform(batch, names), *args, **kwargs)

    return lookup  # type: ignore[return-value]


def lookup_method(method: M) -> M:
    """:func:`constant_under_transforms`, and run eagerly under ``torch.compile``: while Dynamo
    traces, the call goes through ``torch._disable_dynamo`` (a graph break around it; Dynamo is
    imported then, never in eager mode, where importing it costs 1.4 s and imports Triton)."""
    plain = constant_under_transforms(method)
    eager = torch._disable_dynamo(plain)

    @functools.wraps(method)
    def lookup(self, batch, *args, **kwargs):
        if torch.compiler.is_compiling() and not torch.compiler.is_exporting():   # export: traced (one op)
            return eager(self, batch, *args, **kwargs)
        return plain(self, batch, *args, **kwargs)

    return lookup  # type: ignore[return-value]
