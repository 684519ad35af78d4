"""The pooled lookup under ``torch.export``: one custom op, for inference.

In eager mode a lookup runs Python around the C++ kernels: the batch's layout check, the features
put in the order of the groups, one kernel per group, with reads of the offsets (``.tolist()``)
to split the ids. ``torch.export`` traces with fake tensors, which have no data to read, so while
it runs, ``TableBatchedEmbedding.forward`` calls :func:`exported_lookup`: all of that inside one
opaque node of the graph, ``neo::pooled_lookup``, whose fake kernel gives the output's shape
``(B, sum of D)``. The exported program then runs the same kernels as eager mode (and gives the
same numbers, bit for bit) and checks its input as eager mode does: a malformed batch raises
``JaggedValidationError`` naming the feature, an id outside its table ``EmbeddingInputError``
naming feature, table and id. The tables are the program's buffers; every static fact the op
needs (feature order, rows, table names, widths) is an argument of the node, so a program saved
with ``torch.export.save`` loads and runs in another process that imports ``neo.export``.

Inference only: the fused update runs inside the backward, which an exported graph does not
carry, so a module in training mode is refused, as are cached tables (their rows move between
host and device per batch) and the GPU backends (the op runs the CPU kernels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import torch

from neo.cpp import cpu_kernels
from neo.embedding.checks import check_features, check_ids
from neo.embedding.layout import GroupLayout
from neo.sparse import KeyedJaggedBatch

if TYPE_CHECKING:
    from neo.embedding.module import TableBatchedEmbedding

__all__ = ["exported_lookup", "pooled_lookup"]

_META = len(GroupLayout.KERNEL_FIELDS)   # tensors of a group's layout the kernel takes
_SEP = "\n"     # joins names into one string argument (a feature name has no newline: configs refuse one)


@torch.library.custom_op("neo::pooled_lookup", mutates_args=())
def pooled_lookup(weights: List[torch.Tensor], meta: List[torch.Tensor], values: torch.Tensor,
                  lengths: torch.Tensor, offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor],
                  keys: str, order: List[int], group_sizes: List[int], rows: List[int], tables: str,
                  width: int) -> torch.Tensor:
    """(B, width) fp32: the groups' pooled lookups, in group order.

    ``keys``: the batch's features (``_SEP``-joined), B = len(lengths) / len(keys); ``order``: the
    batch position of each feature in group order; ``group_sizes``: features per group;
    ``rows`` / ``tables``: the rows and name of each group-order feature's table; ``meta``: the
    groups' layout tensors, ``_META`` each."""
    names = keys.split(_SEP)
    B = lengths.numel() // len(names)
    batch = KeyedJaggedBatch(tuple(names), values, lengths, B, weights=per_sample_weights, offsets=offsets)
    if B == 0:
        return torch.zeros(0, width, dtype=torch.float32, device=values.device)
    batch = batch.permute([names[i] for i in order])
    ids, offs = batch.values.to(torch.int64), batch.offsets.to(torch.int64)
    check_ids(ids, offs, B, batch.keys, rows, tables.split(_SEP))
    psw = None if batch.weights is None else batch.weights.to(torch.float32)
    kernels = cpu_kernels("embedding_forward")
    starts = offs[::B].tolist()                                  # (F + 1,): each feature's first id
    outs, f0 = [], 0
    for g, nf in enumerate(group_sizes):
        lo, hi = starts[f0], starts[f0 + nf]
        g_off = offs[f0 * B : (f0 + nf) * B + 1] - lo
        out, _ = kernels.embedding_forward(weights[g], ids[lo:hi], g_off, None if psw is None else psw[lo:hi],
                                           *meta[_META * g : _META * (g + 1)], B)
        outs.append(out)
        f0 += nf
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


@pooled_lookup.register_fake
def _(weights, meta, values, lengths, offsets, per_sample_weights, keys, order, group_sizes, rows, tables, width):
    B = lengths.shape[0] // len(keys.split(_SEP))
    return values.new_empty((B, width), dtype=torch.float32)


def exported_lookup(emb: "TableBatchedEmbedding", batch: KeyedJaggedBatch,
                    pooled_bags: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``emb(batch)`` as :func:`pooled_lookup` (B, sum of D) in table order, while ``torch.export`` traces."""
    if pooled_bags is not None:
        raise NotImplementedError("torch.export of a lookup with pooled_bags (a sharded collection's "
                                  "data-parallel replicas): export the unsharded model")
    if emb.training:
        raise RuntimeError("torch.export of a TableBatchedEmbedding exports inference: call model.eval() first "
                           "(the tables' fused update runs inside the backward, which an exported graph lacks)")
    cached = [t.name for t in emb.tables if t.cached]
    if cached:
        raise NotImplementedError(f"torch.export of cached tables ({', '.join(cached)}): their rows move between "
                                  "host and device per batch; export a copy with the tables in memory instead")
    if emb.backend_name != "cpu":
        raise NotImplementedError(f"torch.export of the '{emb.backend_name}' backend: the exported op runs the "
                                  "CPU kernels (build the module with backend='cpu' to export it)")
    check_features(batch, emb.feature_names, emb.feature_table)
    pos = {f: i for i, f in enumerate(batch.keys)}
    by_name = {t.name: t for t in emb.tables}
    tables = [emb.feature_table[f] for f in emb._group_order]
    out = pooled_lookup(
        [g.weights for g in emb.groups], [m for g in emb.groups for m in g.layout.kernel_tensors()],
        batch.values, batch.lengths, batch.offsets, batch.weights, _SEP.join(batch.keys),
        [pos[f] for f in emb._group_order], [len(g.layout.features) for g in emb.groups],
        [by_name[t].num_rows for t in tables], _SEP.join(tables), sum(by_name[t].dim for t in tables))
    return out if emb._out_perm is None else out.index_select(1, emb._out_perm)   # (B, sum D) table order
