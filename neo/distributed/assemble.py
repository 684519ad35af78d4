"""Received pieces of pooled embeddings put into table order: column runs and the copies along them.

Output distributions deliver pooled embeddings as flat buffers of back-to-back ``(B, w)``
matrices ("pieces", :mod:`neo.distributed.sharding`); the sharded collection copies their
column runs into the ``(B, D)`` output in table order (:class:`Assemble`), and the one-host
distribution copies its received blocks the same way (:mod:`.sharding.one_host`).
"""

from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

import torch

__all__ = ["Runs", "column_runs", "copy_runs", "split_runs", "piece_views", "Assemble"]

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


def copy_runs(dst: torch.Tensor, src: torch.Tensor, runs: Runs) -> None:
    """``dst[:, t:t + n] = src[:, s:s + n]`` for every run (one copy each)."""
    for s, t, n in runs:
        dst[:, t:t + n].copy_(src[:, s:s + n])


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
    return {"blocks": out, "widths": widths}


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
        views = [piece_views(f, ws, B) for f, ws in zip(flats, spec["widths"])]
        blocks = spec["blocks"]
        if len(blocks) == 1 and len(flats) == 1:                       # already (B, D) in order
            return flats[0].view(B, D)
        out = flats[0].new_empty(B, D)
        for fi, pi, s, t, n in blocks:
            out[:, t:t + n].copy_(views[fi][pi][:, s:s + n])
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        B, spec, scale = ctx.B, ctx.spec, ctx.scale
        grads = [grad.new_empty(n) for n in ctx.numels]
        views = [piece_views(g, ws, B) for g, ws in zip(grads, spec["widths"])]
        for fi, pi, s, t, n in spec["blocks"]:
            torch.mul(grad[:, t:t + n], scale, out=views[fi][pi][:, s:s + n])
        return (None, None, None, None, *grads)
