"""Received pieces of pooled embeddings put into table order: column runs and the copies along them.

Output distributions deliver pooled embeddings as flat buffers of back-to-back ``(B, w)``
matrices ("pieces", :mod:`neo.distributed.sharding`); the sharded collection copies their
column runs into the ``(B, D)`` output in table order (:class:`Assemble`), and the one-host
distribution copies its received blocks the same way (:mod:`.sharding.one_host`).

:class:`ColumnRuns` does every run of such an assembly in one pass over the rows
(``neo._C.column_runs``, csrc/column_runs.cpp) instead of one torch copy per run: in the main
job (2 ranks, one host) the one-host distribution's ten copies took 0.53-0.67 ms a call. Without
the extension, or on other devices and dtypes, the torch copies run (:func:`reference_runs`,
also the kernel's test oracle).
"""

from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

import torch

from neo.cpp import cpu_kernels

__all__ = ["Runs", "column_runs", "split_runs", "piece_views", "Assemble", "ColumnRuns",
           "reference_runs"]

Runs = List[Tuple[int, int, int]]
"""(source column, target column, width): ``target[:, t:t + n] = source[:, s:s + n]``."""


def column_runs(pairs: Iterable[Tuple[int, int]]) -> Runs:
    """Column pairs (source, target) merged into runs where both advance by one."""
    runs: Runs = []
    for s, t in pairs:
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == t:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, t, 1))
    return runs


def reference_runs(srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor],
                   runs: Sequence[Tuple[int, int, int, int, int, int]], scale: float = 1.0) -> None:
    """For every run ``(src, s, dst, t, n, add)`` in order: ``dsts[dst][:, t:t + n] = scale *
    srcs[src][:, s:s + n]``, or ``+=`` it where ``add`` (torch ops, one per run)."""
    for si, sc, di, dc, n, add in runs:
        src, dst = srcs[si][:, sc:sc + n], dsts[di][:, dc:dc + n]
        if add:
            dst.add_(src)
        elif scale == 1.0:
            dst.copy_(src)
        else:
            torch.mul(src, scale, out=dst)


class ColumnRuns:
    """Column runs ``(src, src col, dst, dst col, n, add)`` between matrices of the same rows,
    applied in one call (see the module docstring); the adds sum in run order, in fp32."""

    def __init__(self, runs: Iterable[Tuple[int, int, int, int, int, int]]):
        self.runs = [tuple(int(v) for v in r) for r in runs]
        self.table = torch.tensor(self.runs, dtype=torch.int64).reshape(-1, 6)

    def __call__(self, srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], scale: float = 1.0) -> None:
        if not self.runs:
            return
        C = cpu_kernels("column_runs")
        if C is not None and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.dim() == 2
                                 and (t.shape[1] <= 1 or t.stride(1) == 1) for t in (*srcs, *dsts)):
            C.column_runs(list(srcs), list(dsts), self.table, scale)
        else:
            reference_runs(srcs, dsts, self.runs, scale)


def split_runs(runs: Runs, widths) -> dict:
    """Cut column runs at piece boundaries: (flat index, piece index in flat, src col, dst col, n)."""
    pieces, acc = [], 0                                     # (flat, piece, start col in concat order, width)
    for fi, ws in enumerate(widths):
        for pi, w in enumerate(ws):
            pieces.append((fi, pi, acc, w))
            acc += w
    out = []
    for s, t, n in runs:
        while n:
            fi, pi, p0, w = next(p for p in pieces if p[2] <= s < p[2] + p[3])
            m = min(n, p0 + w - s)
            out.append((fi, pi, s - p0, t, m))
            s, t, n = s + m, t + m, n - m
    first = [sum(len(ws) for ws in widths[:fi]) for fi in range(len(widths))]     # flat index of (fi, 0)
    return {"blocks": out, "widths": widths,
            "forward": ColumnRuns((first[fi] + pi, s, 0, t, n, 0) for fi, pi, s, t, n in out),
            "backward": ColumnRuns((0, t, first[fi] + pi, s, n, 0) for fi, pi, s, t, n in out)}


def piece_views(flat: torch.Tensor, ws: Sequence[int], B: int) -> List[torch.Tensor]:
    """The (B, w) matrices held back to back in ``flat``, one per width of ``ws``."""
    views, off = [], 0
    for w in ws:
        views.append(flat[off:off + B * w].view(B, w))
        off += B * w
    return views


class Assemble(torch.autograd.Function):
    """Copies every piece's column runs into the (B, D) output in table order, in one pass.

    Backward: the same block copies the other way, with the 1 / W gradient scale folded in
    (no zero fill, no index_add, no separate scaling pass).
    """

    @staticmethod
    def forward(ctx, B: int, D: int, spec, scale: float, *flats: torch.Tensor):
        ctx.B, ctx.spec, ctx.scale = B, spec, scale
        ctx.numels = [f.numel() for f in flats]
        if len(spec["blocks"]) == 1 and len(flats) == 1:               # already (B, D) in order
            return flats[0].view(B, D)
        out = flats[0].new_empty(B, D)
        spec["forward"]([v for f, ws in zip(flats, spec["widths"]) for v in piece_views(f, ws, B)], [out])
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        B, spec, scale = ctx.B, ctx.spec, ctx.scale
        grads = [grad.new_empty(n) for n in ctx.numels]
        views = [piece_views(g, ws, B) for g, ws in zip(grads, spec["widths"])]
        spec["backward"]([grad], [v for vs in views for v in vs], scale)
        return (None, None, None, None, *grads)
