"""FBGEMM backend: FBGEMM's table-batched embedding (``fbgemm_gpu``) behind Neo's interface.

A baseline and an option. FBGEMM's CPU TBE stores a group's tables exactly as Neo's
layout does (one flat buffer, tables one after another, row-wise momentum one value per
row), so the FBGEMM module is made to *alias* Neo's weight and state buffers: updates
FBGEMM applies are Neo's updates, and checkpoints, sharding and state access keep working.

FBGEMM's fused update runs in its own autograd backward: ``forward`` keeps FBGEMM's
output graph, the caller takes it (``take_forward_graph``) and keeps it with the lookup's
autograd node, and ``backward_update`` back-propagates into the graph of that lookup (so
several lookups may run before their backwards, in any order, and a lookup without a backward
leaves nothing behind).

Supported: sgd, adagrad and rowwise_adagrad (FBGEMM's EXACT_* optimizers) without weight
decay (FBGEMM's CPU kernels either ignore it or apply it differently from torch.optim); one pooling mode per group; per-id weights with sum pooling. FBGEMM's CPU kernels
do not support Adam or LAMB, nor bf16 weights (fp32 and fp16 only); FBGEMM's stochastic
rounding draws its own random numbers, so fp16 results agree with Neo's statistically, not bit
for bit.
"""

from __future__ import annotations

from typing import Dict

import torch

from neo.config.embedding import OptimizerType, WeightDType
from neo.embedding.layout import GroupLayout

try:  # fbgemm_gpu is an optional peer
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )
    from fbgemm_gpu.tbe.config.embedding_config import PoolingMode as FbgemmPooling
except ImportError as exc:  # pragma: no cover - exercised where fbgemm_gpu is absent
    raise ImportError(
        "the 'fbgemm' embedding backend needs fbgemm_gpu (pip install fbgemm-gpu-cpu==1.8.0, "
        "or bash tools/setup.sh --dev)"
    ) from exc

_OPTIMIZERS = {
    OptimizerType.SGD: EmbOptimType.EXACT_SGD,
    OptimizerType.ADAGRAD: EmbOptimType.EXACT_ADAGRAD,
    OptimizerType.ROWWISE_ADAGRAD: EmbOptimType.EXACT_ROWWISE_ADAGRAD,
}
_PRECISION = {WeightDType.FP32: SparseType.FP32, WeightDType.FP16: SparseType.FP16}   # its CPU kernels: no bf16


class FbgemmBackend:
    name = "fbgemm"

    def __init__(self) -> None:
        self._modules: Dict[int, SplitTableBatchedEmbeddingBagsCodegen] = {}
        self._graphs: Dict[int, torch.Tensor] = {}    # FBGEMM's output of the forward not yet taken, per group

    def _module(self, layout: GroupLayout, weights: torch.Tensor, states) -> SplitTableBatchedEmbeddingBagsCodegen:
        key = id(layout)
        tbe = self._modules.get(key)
        if tbe is not None and tbe.weights_host.data_ptr() == weights.data_ptr():
            return tbe
        opt = layout.optimizer
        if opt.type not in _OPTIMIZERS:
            raise NotImplementedError(
                f"the fbgemm backend on CPU supports optimizers {[o.value for o in _OPTIMIZERS]}, not "
                f"'{opt.type.value}' (tables {[t.name for t in layout.tables]})"
            )
        if opt.weight_decay:
            # Measured against the reference: FBGEMM's EXACT_SGD on CPU ignores weight decay, and
            # its adagrad variants leave the decay term out of the squared-gradient accumulator,
            # while Neo (like torch.optim) adds it to the gradient first.
            raise NotImplementedError(
                f"the fbgemm backend cannot reproduce Neo's weight decay for '{opt.type.value}'; use "
                f"weight_decay=0 or another backend (tables {[t.name for t in layout.tables]})"
            )
        if layout.dtype not in _PRECISION:
            raise NotImplementedError(
                f"the fbgemm backend on CPU stores weights as {[d.value for d in _PRECISION]}, not "
                f"'{layout.dtype.value}' (tables {[t.name for t in layout.tables]})"
            )
        means = set(layout.feature_mean.tolist())
        if len(means) > 1:
            raise NotImplementedError("the fbgemm backend needs one pooling mode per group of tables")
        if weights.device.type != "cpu":
            raise NotImplementedError("this build of the fbgemm backend runs FBGEMM's CPU kernels only")
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(int(r), int(d), EmbeddingLocation.HOST, ComputeDevice.CPU)
             for r, d in zip(layout.table_rows.tolist(), layout.table_dims.tolist())],
            feature_table_map=layout.feature_table.tolist(),
            optimizer=_OPTIMIZERS[opt.type],
            learning_rate=opt.lr,
            eps=opt.eps,
            weights_precision=_PRECISION[layout.dtype],
            stochastic_rounding=layout.stochastic_rounding,
            pooling_mode=FbgemmPooling.MEAN if means == {1} else FbgemmPooling.SUM,
        )
        # Alias Neo's storage: FBGEMM reads and updates our buffers in place.
        assert tbe.weights_host.numel() == weights.numel(), "FBGEMM's weight layout differs from Neo's"
        tbe.weights_host = torch.nn.Parameter(weights, requires_grad=True)
        if states:
            assert tbe.momentum1_host.numel() == states[0].numel(), "FBGEMM's state layout differs from Neo's"
            tbe.momentum1_host = torch.nn.Parameter(states[0], requires_grad=False)
        self._modules[key] = tbe
        return tbe

    def forward(self, layout, weights, indices, offsets, per_sample_weights, batch_size):
        tbe = self._modules.get(id(layout))
        if tbe is None:
            raise RuntimeError("FbgemmBackend.prepare() must be called before forward")
        if per_sample_weights is not None and int(layout.feature_mean.max()) == 1:
            raise NotImplementedError("the fbgemm backend supports per-id weights with sum pooling only")
        if per_sample_weights is not None:    # their gradient is the lookup's (PooledLookup), not FBGEMM's graph's
            per_sample_weights = per_sample_weights.detach()
        with torch.enable_grad():
            out = tbe(indices, offsets, per_sample_weights)                 # (B, total_dim)
        self._graphs[id(layout)] = out
        return out.detach()

    def take_forward_graph(self, layout: GroupLayout) -> torch.Tensor:
        """FBGEMM's output of the last ``forward`` of this group, with its graph (what
        ``backward_update`` back-propagates into); the backend keeps no reference to it."""
        return self._graphs.pop(id(layout))

    def prepare(self, layout: GroupLayout, weights: torch.Tensor, states) -> None:
        """Build (or find) the FBGEMM module aliasing this group's buffers."""
        self._module(layout, weights, states)

    def backward_update(self, layout, weights, states, grad_output, indices, offsets,
                        per_sample_weights, batch_size, lr, step, seed, forward_graph=None):
        """``forward_graph``: what ``take_forward_graph`` gave after this lookup's forward."""
        if forward_graph is None:
            raise RuntimeError(f"the fbgemm backend updates from the graph of the lookup's forward "
                               f"(take_forward_graph); none was given (tables {[t.name for t in layout.tables]})")
        tbe = self._module(layout, weights, states)
        tbe.set_learning_rate(lr)
        forward_graph.backward(grad_output)
