"""Feature interactions: DLRM's pairwise dot products and DCNv2's low-rank cross layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from neo.cpp import cpu_kernels
from neo.models.autograd_modes import plain_autograd
from neo.models.traced_ops import dot_interaction_fused, fused_applies


class _PairwiseDots(torch.autograd.Function):
    """The distinct pairwise dot products of the rows of ``v`` (B, n, D): (B, P), P = n(n-1)/2.

    Forward: the Gram matrix ``v v^T`` in one bmm, then one flat gather of its upper triangle.
    Backward: the pair gradients scattered into a (B, n, n) matrix ``G`` (zero elsewhere),
    and ``d v = (G + G^T) v`` in one bmm. Autograd through the two-index gather instead
    costs several scatters of the full (B, n, n) gradient; on DLRM's shapes (B 2048, n 27,
    D 64) this is about 3.5x faster forward+backward on one CPU thread. Both in torch ops, so
    torch.func's transforms (grad, vmap, jacrev) take it as it is (``generate_vmap_rule``).
    Forward mode (dual tensors, ``torch.func.jvp``, ``jacfwd``): the tangent of ``v_i . v_j`` is
    ``t_i . v_j + v_i . t_j``, the upper triangle of ``T + T^T`` with ``T = t v^T``, one bmm.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(v: torch.Tensor, flat_pairs: torch.Tensor) -> torch.Tensor:
        B, n, _ = v.shape
        gram = torch.bmm(v, v.transpose(1, 2))                                   # (B, n, n)
        return gram.reshape(B, n * n).index_select(1, flat_pairs)                # (B, P)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, grad_pairs: torch.Tensor):
        v, flat_pairs = ctx.saved_tensors
        B, n, _ = v.shape
        G = grad_pairs.new_zeros(B, n * n)
        if torch._C._are_functorch_transforms_active():   # vmap has a rule for index_copy, not index_copy_
            G = G.index_copy(1, flat_pairs, grad_pairs)
        else:
            G.index_copy_(1, flat_pairs, grad_pairs)                             # (B, n*n) upper triangle
        G = G.view(B, n, n).to(v.dtype)
        return torch.bmm(G + G.transpose(1, 2), v), None                         # (B, n, D)

    @staticmethod
    def jvp(ctx, v_t: torch.Tensor, _flat_pairs_t) -> torch.Tensor:
        v, flat_pairs = ctx.saved_tensors
        B, n, _ = v.shape
        T = torch.bmm(v_t, v.transpose(1, 2))                                    # (B, n, n): t_i . v_j
        return (T + T.transpose(1, 2)).reshape(B, n * n).index_select(1, flat_pairs)   # (B, P)


@dataclass
class PooledPieces:
    """Pooled embeddings ``(B, F * D)`` left where a sharded collection's output distribution put them.

    Feature k of sample b is ``flat[offsets[k] + b * strides[k]:][:D]`` (e.g. the source-major
    output of the pooled AlltoAll); the B * F vectors tile ``flat`` exactly. ``flat`` carries the autograd graph; a consumer that reads
    it in place returns its gradient in the same layout, multiplied by ``grad_scale``.
    ``tensor()`` materializes the usual ``(B, F * D)`` tensor instead (same values, same
    gradients), for consumers that need one.
    """

    flat: torch.Tensor
    offsets: torch.Tensor          # (F,) int64
    strides: torch.Tensor          # (F,) int64
    grad_scale: float
    tensor: Callable[[], torch.Tensor]


def as_tensor(pooled) -> torch.Tensor:
    """``(B, F * D)`` from a tensor or :class:`PooledPieces`."""
    return pooled.tensor() if isinstance(pooled, PooledPieces) else pooled


_eager_op: Callable | None = None
"""``neo._C.dot_interaction_eager`` once :func:`_find_eager_op` has found it."""


def _find_eager_op() -> Callable | None:
    """``neo._C.dot_interaction_eager``, or None where ``neo._C`` is not built with it (a build
    of older sources). The fused op (csrc/interaction.cpp): ``[dense, pairwise dots]`` in one
    C++ kernel each way, with its backward as a C++ autograd node. No concatenated (B, n, D)
    copy, no (B, n, n) Gram matrix, gradients written straight into ``(B, D)`` and the pooled
    layout (``(B, F * D)``, or a :class:`PooledPieces` buffer read in place). fp32 CPU tensors
    only. It is registered as ``torch.ops.neo.dot_interaction``; the module calls the same
    autograd node through ``dot_interaction_eager`` (no dispatcher), which also makes the
    module's checks (CPU, fp32, no autocast) in C++: tens of microseconds less a call with
    cold caches (csrc/interaction.h, docs/benchmarks.md)."""
    global _eager_op
    if _eager_op is None:
        _eager_op = getattr(cpu_kernels("dot_interaction_forward"), "dot_interaction_eager", None)
    return _eager_op


class DotInteraction(nn.Module):
    """Pairwise dot products of the dense vector and the F pooled embeddings (DLRM, Naumov et al. 2019).

    Input: dense ``(B, D)`` and pooled ``(B, F * D)``. The F + 1 vectors of a sample are
    dotted pairwise (each unordered pair once, no self-products) and appended to the dense
    vector: output ``(B, D + (F + 1) * F / 2)``.

    Two implementations of the same function: ``kernel="torch"``, the reference (a
    concatenation, one bmm and a gather: any device and dtype, autocast included), and on
    fp32 CPU tensors outside autocast, ``kernel="auto"`` takes the fused C++ kernels of
    ``neo._C`` when it is built (2.8 to 6.3x faster forward+backward at DLRM's shapes on one
    thread, by CPU, ISA and phase of a shared machine: docs/benchmarks.md). The two agree to
    fp32 rounding (the summation order differs), to second order too: a backward run with
    ``create_graph=True`` through the fused node computes its gradients with differentiable
    torch ops (at about the torch path's speed).
    """

    def __init__(self, num_features: int, dim: int, kernel: str = "auto"):
        super().__init__()
        if kernel not in ("auto", "torch"):
            raise ValueError(f"DotInteraction kernel must be 'auto' or 'torch', got {kernel!r}")
        self.num_features, self.dim = num_features, dim
        if num_features < 0 or dim < 1:
            raise ValueError(f"DotInteraction needs num_features >= 0 and dim >= 1, got {num_features} and {dim}")
        # the fused kernel keeps a sample's F + 1 row pointers on its stack: 1 to 255 features
        # (neo._C refuses others); outside that range the torch path serves
        self._fused = kernel == "auto" and 1 <= num_features <= 255 and _find_eager_op() is not None
        n = num_features + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("flat_pairs", rows * n + cols, persistent=False)   # (P,) into a flat (n, n)
        self.out_features = dim + rows.numel()

    accepts_pooled_pieces = True
    """``forward`` reads :class:`PooledPieces` in place (the fused kernel) or materializes them."""

    def forward(self, dense: torch.Tensor, pooled) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self._traced(dense, pooled)
        # found at construction, or again in a process that unpickled this module; not under
        # torch.func's transforms or forward-mode AD, for which the C++ node has no rules
        fused = self._fused and plain_autograd()
        op = (_eager_op or _find_eager_op()) if fused else None
        if op is not None:
            out = (op(dense, pooled.flat, self.num_features, pooled.offsets, pooled.strides, pooled.grad_scale)
                   if isinstance(pooled, PooledPieces) else op(dense, pooled, self.num_features))
            if out is not None:   # None where the fused kernel does not apply (not CPU fp32, or autocast)
                return out                                                                  # (B, D + P)
        return self._torch_path(dense, as_tensor(pooled))

    def _traced(self, dense: torch.Tensor, pooled) -> torch.Tensor:
        """The forward under ``torch.compile`` or ``torch.export``: the fused kernels as the custom op
        ``neo::dot_interaction_fused`` (neo/models/traced_ops.py), one node of the graph."""
        pooled = as_tensor(pooled)
        if self._fused and plain_autograd() and fused_applies(dense, pooled):
            return dot_interaction_fused(dense, pooled, self.num_features)                      # (B, D + P)
        return self._torch_path(dense, pooled)

    def _torch_path(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        B = dense.shape[0]
        vectors = torch.cat([dense.unsqueeze(1), pooled.view(B, self.num_features, self.dim)], dim=1)  # (B, F+1, D)
        pairs = _PairwiseDots.apply(vectors, self.flat_pairs)                                           # (B, (F+1)F/2)
        return torch.cat([dense, pairs.to(dense.dtype)], dim=1)


class LowRankCrossNet(nn.Module):
    """DCNv2's cross network with low-rank weights (Wang et al. 2021, eq. 1 with ``W = U V``).

    ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l`` for ``num_layers`` layers, ``U_l`` of shape
    ``(N, r)``, ``V_l`` of shape ``(r, N)``; as in MLPerf's DLRM-DCNv2 (3 layers, rank 512).
    The input is the dense vector and the pooled embeddings side by side: ``(B, N)``, ``N = D + F * D``.
    """

    def __init__(self, in_features: int, num_layers: int = 3, low_rank: int = 512):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(in_features, low_rank, bias=False) for _ in range(num_layers))
        self.up = nn.ModuleList(nn.Linear(low_rank, in_features, bias=True) for _ in range(num_layers))
        for lin in list(self.down) + list(self.up):
            nn.init.xavier_normal_(lin.weight)
        for lin in self.up:
            nn.init.zeros_(lin.bias)
        self.out_features = in_features

    def forward(self, dense: torch.Tensor, pooled) -> torch.Tensor:
        x0 = torch.cat([dense, as_tensor(pooled)], dim=1)                                                          # (B, N)
        x = x0
        for down, up in zip(self.down, self.up):
            x = x0 * up(down(x)) + x                                                                     # (B, N)
        return x
