"""``torch.export`` of a model with Neo's tables, for inference and serving.

    model.eval()
    program = neo.export.export(model, (dense, batch))     # batch size and id count dynamic
    torch.export.save(program, "dlrm.pt2")
    ...                                                    # elsewhere, after `import neo.export`
    program = torch.export.load("dlrm.pt2")
    logits = program.module()(dense, batch)

:func:`export` is ``torch.export.export`` with the dynamic shapes of :func:`dynamic_shapes`: every
tensor argument's first dimension is the batch, and a :class:`~neo.sparse.KeyedJaggedBatch`
(a pytree node, as TorchRec's KeyedJaggedTensor) has ``F * B`` bags and any number of ids. The
lookups become one ``neo::pooled_lookup`` node each (:mod:`neo.embedding.exported`), the dot
interaction ``neo::dot_interaction_fused`` (:mod:`neo.models.traced_ops`); the tables are the
program's buffers. The program checks its batches as eager mode does and gives the same numbers.
Importing this module registers those ops, which loading a saved program needs.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

import neo.embedding.exported  # noqa: F401  (registers neo::pooled_lookup: a saved program loads after this import)
import neo.models.traced_ops  # noqa: F401     (registers neo::dot_interaction_fused)
from neo.sparse import KeyedJaggedBatch

__all__ = ["dynamic_shapes", "export"]


def dynamic_shapes(args: Sequence[Any], batch: Optional[torch.export.Dim] = None,
                   ids: Optional[torch.export.Dim] = None) -> tuple:
    """The ``dynamic_shapes`` of ``torch.export.export`` for ``args``: dimension 0 of every tensor is
    ``batch`` (B); a KeyedJaggedBatch's ids (values, weights) are ``ids`` long, its lengths (F, B) in
    the pytree (:mod:`neo.sparse`), its offsets F * B + 1; anything else static."""
    batch = batch if batch is not None else torch.export.Dim("batch", min=1)
    ids = ids if ids is not None else torch.export.Dim("ids", min=1)

    def spec(a):
        if isinstance(a, torch.Tensor):
            return {0: batch} if a.dim() else None
        if isinstance(a, KeyedJaggedBatch):
            F = len(a.keys)
            weights = None if a.weights is None else {0: ids}
            return [{0: ids}, {1: batch}, {0: F * batch + 1}, weights]   # values, lengths (F, B), offsets, weights
        return None

    return tuple(spec(a) for a in args)


def export(model: torch.nn.Module, args: Sequence[Any], **kwargs) -> torch.export.ExportedProgram:
    """``torch.export.export(model, args, dynamic_shapes=dynamic_shapes(args), **kwargs)`` of a model in
    eval mode (RuntimeError otherwise: an exported graph does not carry the tables' fused update)."""
    if model.training:
        raise RuntimeError("neo.export.export: the model is in training mode; exporting is for inference, "
                           "call model.eval() first")
    kwargs.setdefault("dynamic_shapes", dynamic_shapes(args))
    return torch.export.export(model, tuple(args), **kwargs)
