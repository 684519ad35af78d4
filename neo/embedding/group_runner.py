"""A group's storage and its fused kernels under autograd: what :class:`~neo.embedding.TableBatchedEmbedding`
runs once per group of tables (one flat buffer, one kernel launch each way).

- :class:`GroupRunner`: the group's buffers (registered on the owning module) and views of each table's part;
- :func:`pool`: the pooled lookup through the backend;
- :class:`PooledLookup`: that lookup with its backward, the fused gradient aggregation and
  optimizer update in place (no gradient of the tables returned; per-id weights that require
  grad get theirs);
- :func:`ids_of_bags`: the ids of the bags a rank pools (data-parallel tables).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, List, Optional

import torch

from neo.embedding.anchor import anchor_grad
from neo.embedding.backends.reference import per_sample_weights_grad
from neo.embedding.cache import Prefetched
from neo.embedding.layout import GroupLayout
from neo.embedding.loss_scale import record_overflow, unscaled_gradient

if TYPE_CHECKING:
    from neo.embedding.module import TableBatchedEmbedding

__all__ = ["GroupRunner", "PooledLookup", "pool", "ids_of_bags"]


class GroupRunner:
    """One group's storage and its backend; ``forward``/``backward_update`` in one place."""

    def __init__(self, owner: "TableBatchedEmbedding", index: int, layout: GroupLayout):
        self.owner, self.index, self.layout = owner, index, layout

    @property
    def weights(self) -> torch.Tensor:
        return getattr(self.owner, f"group{self.index}_weights")

    @property
    def states(self) -> List[torch.Tensor]:
        return [getattr(self.owner, f"group{self.index}_{n}") for n in self.layout.optimizer.type.state_names()]

    @property
    def step(self) -> torch.Tensor:
        return getattr(self.owner, f"group{self.index}_step")

    def table_slots(self, t: int) -> torch.Tensor:
        """(kernel rows, D) view of table ``t``'s part of the weight buffer (a cached table: its slots)."""
        rows, dim, off = int(self.layout.table_rows[t]), int(self.layout.table_dims[t]), int(self.layout.weight_offsets[t])
        return self.weights[off : off + rows * dim].view(rows, dim)

    def table_state_slots(self, t: int) -> List[torch.Tensor]:
        """Views of table ``t``'s optimizer state: (kernel rows, D) per element, (kernel rows,) per row."""
        rows, dim = int(self.layout.table_rows[t]), int(self.layout.table_dims[t])
        if self.layout.optimizer.type.rowwise_state:
            r0 = int(self.layout.row_offsets[t])
            return [s[r0 : r0 + rows] for s in self.states]
        off = int(self.layout.weight_offsets[t])
        return [s[off : off + rows * dim].view(rows, dim) for s in self.states]


def pool(runner: GroupRunner, indices, offsets, per_sample_weights, batch_size: int, with_graph: bool = False,
         invalid_counts: Optional[torch.Tensor] = None):
    """The group's pooled lookup (B, sum of D), through its backend; with ``with_graph``, also
    what the backend's update needs from this forward (``take_forward_graph``: fbgemm's output
    graph; None for the others), for the caller to keep with the lookup (never left in the backend).
    ``invalid_counts``: (F,) int32 that a backend with ``counts_invalid_per_feature`` adds each
    feature's invalid ids into."""
    backend = runner.owner.backend
    prepare = getattr(backend, "prepare", None)   # backends that wrap storage (fbgemm)
    if prepare is not None:
        prepare(runner.layout, runner.weights, runner.states)
    counting = {} if invalid_counts is None else {"invalid_counts": invalid_counts}
    out = backend.forward(runner.layout, runner.weights, indices, offsets, per_sample_weights, batch_size, **counting)
    take = getattr(backend, "take_forward_graph", None)
    graph = take(runner.layout) if take is not None else None
    return (out, graph) if with_graph else out


def ids_of_bags(bags: torch.Tensor, offsets: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) bool: the ids of the flagged bags (``bags``: (nb,) bool; ``offsets``: (nb + 1,) int64).
    What ``repeat_interleave(bags, lengths)`` gives, at half its cost on the CPU: +1 where a run of
    flagged bags starts, -1 where it ends, at the bags' first ids, then a running sum."""
    flag = bags.to(torch.int32)
    change = torch.diff(flag, prepend=flag.new_zeros(1))
    marks = torch.zeros(n + 1, dtype=torch.int32, device=bags.device)
    # bags starting at the same id (empty ones before a full one) add their changes there: the
    # running sum then holds the flag of the last of them, the bag that owns the id
    marks.index_add_(0, offsets[:-1], change)
    return torch.cumsum(marks[:-1], 0, dtype=torch.int32).bool()


class PooledLookup(torch.autograd.Function):
    """Forward: pooled lookup. Backward: fused gradient aggregation + optimizer step; returns the
    gradient of the per-id weights where they require grad, nothing else."""

    @staticmethod
    def forward(ctx, anchor, runner: GroupRunner, indices, offsets, per_sample_weights, batch_size: int,
                prefetched: Optional[Prefetched] = None, pooled=None, update: bool = True,
                pooled_ids: Optional[torch.Tensor] = None, invalid_counts: Optional[torch.Tensor] = None):
        """``pooled``: (indices, offsets, weights) the forward pools when only some bags are
        pooled (see ``TableBatchedEmbedding.forward``), ``pooled_ids`` (N,) bool the ids of those
        bags; the backward always updates from all. ``update``: False where only the gradient of
        ``per_sample_weights`` is wanted (a lookup in eval mode): the backward then updates nothing.
        ``invalid_counts``: as for :func:`pool` (not with ``pooled``)."""
        ctx.runner, ctx.batch_size, ctx.prefetched, ctx.update = runner, batch_size, prefetched, update
        ctx.save_for_backward(indices, offsets, per_sample_weights, pooled_ids)
        out, graph = pool(runner, *(pooled if pooled is not None else (indices, offsets, per_sample_weights)),
                          batch_size, with_graph=True, invalid_counts=invalid_counts)
        if graph is not None and pooled is not None:
            # the update is from every bag: the graph of the whole lookup (the output stays the pooled one)
            _, graph = pool(runner, indices, offsets, per_sample_weights, batch_size, with_graph=True)
        ctx.forward_graph = graph
        return out

    @staticmethod
    def backward(ctx, grad_output):
        indices, offsets, per_sample_weights, pooled_ids = ctx.saved_tensors
        runner = ctx.runner
        owner = runner.owner
        grad_weights = None
        if ctx.needs_input_grad[4]:       # per-id weights that require grad: from the rows before the update
            kernel = getattr(owner.backend, "per_sample_weights_grad", per_sample_weights_grad)
            grad_weights = kernel(runner.layout, runner.weights, grad_output, indices, offsets, ctx.batch_size)
            if pooled_ids is not None:    # the other bags came out as zeros, whatever their weights
                grad_weights = grad_weights * pooled_ids
        if not ctx.update:
            return anchor_grad(ctx, owner), None, None, None, grad_weights, None, None, None, None, None, None
        grad = unscaled_gradient(owner, grad_output)   # None: a loss scaler's overflow, no update
        if grad is not None:
            step = int(runner.step) + 1      # counted once the update is done: a failed one is not a step
            with (owner.timers("embedding_bwd") if owner.timers is not None else contextlib.nullcontext()):
                owner.backend.backward_update(
                    runner.layout, runner.weights, runner.states, grad,
                    indices, offsets, per_sample_weights, ctx.batch_size,
                    owner.learning_rates[runner.index], step, owner.rounding_seed,
                    **({} if ctx.forward_graph is None else {"forward_graph": ctx.forward_graph}),
                )
            runner.step.fill_(step)
        else:
            record_overflow(owner, grad_output.device)   # counted, and the scaler backs off
        ctx.forward_graph = None
        if ctx.prefetched is not None:       # this step is done with the group's cached rows
            owner._cache.complete(ctx.prefetched, [c.name for c in runner.layout.tables])
        return anchor_grad(ctx, owner), None, None, None, grad_weights, None, None, None, None, None, None
