"""Every sharding type's output distribution in ONE AlltoAll per direction, on one host.

With all ranks on one host (``num_nodes == 1``), the per-type distributions reduce to two
patterns: table_wise, column_wise and table_column_wise send each rank the ``(B, cols)``
rows of its own samples (an AlltoAll); row_wise and table_row_wise send each rank the
partial sums of its samples, which it adds up (on the CPU the ReduceScatter already is an
AlltoAll and a local fp32 sum, :func:`neo.distributed.comms._launch_reduce_scatter`).
Data-parallel tables keep their own rows. So one AlltoAll can carry every type at once: a
step then launches, waits and pays the Python around one collective forward and one
backward instead of one or two per sharding type. The bytes are those of the per-type
collectives, and the result is theirs bit for bit (tests/distributed/test_one_host.py).

The wire (rank q's block for each destination; ``B`` rows, one per sample)::

    forward    [ q's table/column-wise columns | partial sums of every row-wise feature,
                 full width, zeros where q holds no shard | q's table_column_wise columns ]
    backward   the forward's block for q, then q's data-parallel columns

that is, q's local pooled columns in their own order (row-wise ones widened to every
feature's full width), so where q holds a shard of every row-wise table the forward sends
q's pooled output itself (without its data-parallel columns) and the backward receives the
gradient of it without a copy.

Forward (rank ``me``): send ``(W * B, Dw_me)``; receive ``(B, Dw_q)`` from every q;
output ``(B, D)`` in table order: each q's own columns, the sum over q of the row-wise
blocks (mean-pooled features divided by their bag lengths), and this rank's data-parallel
rows. Backward: each q receives the gradient of its columns for this rank's samples, the
row-wise gradient of this rank's samples (the ReduceScatter's backward is an AllGather) and
the data-parallel gradient of them (that of :func:`~neo.distributed.comms.slice_local_pooled`).
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from neo.distributed.assemble import ColumnRuns, column_runs, piece_views
from neo.distributed.comms import (Awaitable, BackwardOrder, CommConfig, _differentiable, _launch_a2a,
                                   _Launched)
from neo.distributed.input_dist import DistributedBatch
from neo.distributed.plan_view import ShardingType
from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharding import Pieces
from neo.distributed.sharding.row_wise import MeanDivider
from neo.distributed.slots import SlotLayout

__all__ = ["OneHostOutputDist"]

_T = ShardingType
_SUMMED = (_T.ROW_WISE, _T.TABLE_ROW_WISE)
_LOCAL = (_T.DATA_PARALLEL,)


class _Wire:
    """Rank q's wire columns (see the module docstring): for each, the local pooled column it
    comes from (-1: a row-wise column q holds no shard of, sent as zero) and the global output
    column it belongs to."""

    def __init__(self, layout: SlotLayout, q: int, summed_features: Sequence[str]):
        local, glob = [], []
        starts = layout.local_columns(q)
        slots = layout.slots_on[q]
        held = {}                                   # global column -> local column, q's row-wise shards
        for i, s in enumerate(slots):
            if s.sharding_type in _SUMMED:
                held.update(zip(layout.global_columns(s), range(starts[i], starts[i] + s.cols)))
        summed_cols = [c for f in summed_features
                       for c in range(layout.feature_offset[f], layout.feature_offset[f] + layout.feature_table[f].dim)]
        summed_done = False
        self.summed_start = 0
        for i, s in enumerate(slots):
            if s.sharding_type in _LOCAL:
                continue
            if s.sharding_type in _SUMMED:
                if not summed_done:
                    self.summed_start = len(local)
                    local += [held.get(c, -1) for c in summed_cols]
                    glob += summed_cols
                    summed_done = True
                continue
            local += list(range(starts[i], starts[i] + s.cols))
            glob += layout.global_columns(s)
        if not summed_done:                          # q holds no row-wise shard: the block still goes in
            self.summed_start = sum(s.cols for s in slots if s.sharding_type.output_group < _T.ROW_WISE.output_group)
            local[self.summed_start:self.summed_start] = [-1] * len(summed_cols)
            glob[self.summed_start:self.summed_start] = summed_cols
        self.summed_width = len(summed_cols)
        self.local, self.glob = local, glob
        self.own = [(j, c) for j, c in enumerate(glob)                    # (wire column, output column)
                    if not self.summed_start <= j < self.summed_start + self.summed_width]
        dp = [(starts[i] + k, c) for i, s in enumerate(slots) if s.sharding_type in _LOCAL
              for k, c in enumerate(layout.global_columns(s))]
        self.dp_local, self.dp_glob = [l for l, _ in dp], [c for _, c in dp]
        self.back_glob = glob + self.dp_glob                 # the backward block: forward's, then data-parallel
        self.back_local = local + self.dp_local


class OneHostOutputDist:
    """Every type's pooled output in one AlltoAll per direction (all ranks on one host)."""

    name = "one_host"

    def __init__(self, layout: SlotLayout, pg: ProcessGroups, comm: CommConfig):
        assert pg.num_nodes == 1, "OneHostOutputDist: every rank on one host"
        self.pg, self.comm = pg, comm
        W, me = pg.world_size, pg.rank
        summed = layout.features_of((_T.ROW_WISE,)) + layout.features_of((_T.TABLE_ROW_WISE,))   # local slot order
        self.D = layout.output_dim
        self.wires = [_Wire(layout, q, summed) for q in range(W)]
        mine = self.wires[me]
        self.widths = [len(w.glob) for w in self.wires]              # each rank's forward block, columns
        self.back_widths = [len(w.back_glob) for w in self.wires]    # and backward block
        self.local_width = sum(s.cols for s in layout.slots_on[me])
        self.global_columns = list(range(self.D))              # the output comes assembled, in table order
        # forward send: x's columns as the wire wants them (a prefix of x where that is the wire)
        n = len(mine.local)
        self.send_prefix = mine.local == list(range(n))
        have = [(l, j) for j, l in enumerate(mine.local) if l >= 0]
        self.send_runs = ColumnRuns((0, s, 0, t, m, 0) for s, t, m in column_runs(have))     # x -> wire
        self.send_zero = len(have) < n
        # forward receive, in one pass (sources: each q's block, then this rank's x rows): each q's
        # own columns, the row-wise partial sums added up in rank order, the data-parallel rows
        self.summed_runs = column_runs(enumerate(mine.glob[mine.summed_start:mine.summed_start + mine.summed_width]))
        receive = [(q, s, 0, t, m, 0) for q, w in enumerate(self.wires) for s, t, m in column_runs(w.own)]
        receive += [(q, w.summed_start + s, 0, t, m, int(q > 0)) for q, w in enumerate(self.wires)
                    for s, t, m in self.summed_runs]
        receive += [(W, s, 0, t, m, 0) for s, t, m in column_runs(zip(mine.dp_local, mine.dp_glob))]
        self.receive_runs = ColumnRuns(receive)
        self.divide = MeanDivider(layout, summed)
        # backward: the gradient columns each q's block takes (g -> block q), and where this rank's
        # local columns are in the block it receives
        self.back_runs = ColumnRuns((0, c, q, j, m, 0) for q, w in enumerate(self.wires)
                                    for c, j, m in column_runs((c, j) for j, c in enumerate(w.back_glob)))
        pick = {l: j for j, l in enumerate(mine.back_local) if l >= 0}
        self.back_identity = mine.back_local == list(range(self.local_width))
        self.back_pick = torch.tensor([pick[c] for c in range(self.local_width)], dtype=torch.int64)

    def __call__(self, x: torch.Tensor, batch: DistributedBatch, order: BackwardOrder) -> Awaitable[Pieces]:
        """``x``: (W * B, Dl), this rank's pooled output (every local column)."""
        B, W, me = batch.batch_size, self.pg.world_size, self.pg.rank
        group = self.pg.world_comm
        fwd, bwd = self.comm.forward.wire_dtype, self.comm.backward.wire_dtype
        widths, back_widths = self.widths, self.back_widths

        divisor: List[torch.Tensor] = []           # mean-pooled row-wise features' bag lengths, for the backward

        def forward(t: torch.Tensor) -> _Launched:
            wire = self._send(t)                                                    # (W * B, Dw_me)
            inner = _launch_a2a(wire.reshape(-1), [B * w for w in widths], [B * widths[me]] * W, group, fwd)
            return _Launched(inner.work, lambda: self._assemble(inner.finish(), t, B, batch, divisor))

        def backward(g: torch.Tensor) -> _Launched:                                   # g: (B, D)
            if divisor:                        # the gradient of y / lengths, as autograd's of the division
                g = g.clone()
                for s, t, n in self.summed_runs:
                    g[:, t:t + n] = g[:, t:t + n] / divisor[0][:, s:s + n]
            send = g.new_empty(B * sum(back_widths))
            self.back_runs([g], piece_views(send, back_widths, B))     # index_select along dim 1 is slower
            Dm = back_widths[me]
            inner = _launch_a2a(send, [B * Dm] * W, [B * w for w in back_widths], group, bwd)

            def finish() -> torch.Tensor:
                got = inner.finish().view(W * B, Dm)
                return got if self.back_identity else got.index_select(1, self.back_pick)    # (W * B, Dl)

            return _Launched(inner.work, finish)

        aw = _differentiable(x, forward, backward, order, self.name)
        return aw.then(lambda out: (out.reshape(-1), [self.D]))

    def _send(self, x: torch.Tensor) -> torch.Tensor:
        n = self.widths[self.pg.rank]
        if self.send_prefix:
            return x if n == x.shape[1] else x[:, :n]
        wire = x.new_zeros(x.shape[0], n) if self.send_zero else x.new_empty(x.shape[0], n)
        self.send_runs([x], [wire])
        return wire

    def _assemble(self, flat: torch.Tensor, x: torch.Tensor, B: int, batch: DistributedBatch,
                  divisor: List[torch.Tensor]) -> torch.Tensor:
        out = flat.new_empty(B, self.D)
        me = self.pg.rank
        self.receive_runs(piece_views(flat, self.widths, B) + [x[me * B:(me + 1) * B]], [out])
        if self.divide.spans:                             # mean-pooled row-wise features: the sums / lengths
            divisor.append(self.divide.divisor(batch, out))
            for s, t, n in self.summed_runs:
                out[:, t:t + n] /= divisor[0][:, s:s + n]
        return out
