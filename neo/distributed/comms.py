"""Collectives of the sharded runtime, each returning an :class:`Awaitable`.

Every collective Neo's runtime uses lives here, launched with ``async_op=True`` so that a
training pipeline can overlap it with compute; ``Awaitable.wait()`` is named in profiler
traces (``neo.wait/<name>``).

Two families:

- plain collectives on integer payloads (input distribution: lengths and ids), no autograd:
  :func:`all_to_all`;
- differentiable collectives on pooled embeddings (output distribution), whose backward
  runs the reverse collective: :func:`all_to_all_pooled` (backward: the AlltoAll with the
  splits swapped), :func:`reduce_scatter_pooled` (backward: AllGather) and
  :func:`slice_local_pooled` (forward: keep this rank's rows; backward: AllGather of the
  gradient, used by data-parallel tables).

Quantized communication (:class:`CommConfig`): pooled payloads may travel as fp16 or bf16,
separately for the forward and the backward pass; values are cast back to fp32 on
arrival, and every sum is taken in fp32 (a quantized ReduceScatter is an AlltoAll of the
16-bit partial sums followed by a local fp32 sum, never a 16-bit reduction).

Ordering of backward collectives. Collectives on one process group must be issued in the
same order on every rank. The forward order is fixed by the code; the backward order is
fixed by a :class:`BackwardOrder` token chain: each differentiable collective's wait node
consumes the token of the previous one, so autograd runs their backwards strictly in
reverse creation order on every rank, whatever else the graph holds.

Groups. Every function takes ``group`` as a torch process group or a
:class:`~neo.distributed.process_groups.CommGroup`; a CommGroup with a shared-memory
exchange (:mod:`.shm`) carries the AlltoAlls and AllGathers of CPU tensors through it,
bit for bit the same result as gloo's.

All collectives verified on gloo (torch 2.13, CPU): all_to_all_single with uneven splits
(int64, fp32, fp16, bf16), reduce_scatter_single, all_gather_single, all_reduce. On gloo
the ReduceScatter runs as AlltoAll + local sum (faster there, see
``_launch_reduce_scatter``); on other backends as reduce_scatter_single.
"""

from __future__ import annotations

import contextlib
import enum
import math
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch.profiler import record_function

from neo.distributed.process_groups import CommGroup
from neo.distributed.shm import ShmTimeout

__all__ = [
    "Awaitable",
    "CollectiveError",
    "is_comm_error",
    "CommPrecision",
    "CommConfig",
    "BackwardOrder",
    "all_to_all",
    "all_to_all_pooled",
    "reduce_scatter_pooled",
    "slice_local_pooled",
    "all_reduce",
    "sum_in_rank_order",
]

T = TypeVar("T")
U = TypeVar("U")

_NO_SPAN = contextlib.nullcontext()


def _span(label: str):
    """A ``record_function`` range where a profiler is recording, else nothing: a range costs ~6 us
    even with no profiler, and a step of the tiny MLPerf config opens ~11 of them."""
    return record_function(label) if torch.autograd._profiler_enabled() else _NO_SPAN


class CollectiveError(RuntimeError):
    """A collective failed or timed out (usually: another rank failed first); names this rank."""


def is_comm_error(e: BaseException) -> bool:
    """Whether ``e`` looks like a failed or timed-out collective (gloo, NCCL, shared memory)."""
    if isinstance(e, ShmTimeout):
        return True
    text = str(e).lower()
    return any(k in text for k in ("gloo", "timed out", "timeout", "connection", "nccl", "peer"))


class Awaitable(Generic[T]):
    """A result that may not be ready yet. ``wait()`` blocks once, then returns the cached value.

    ``then(fn)`` chains a continuation (run on ``wait()``), which is how two-stage
    collectives (hierarchical output distribution) compose.
    """

    def __init__(self, fn: Callable[[], T], name: str, progress: Optional[Callable[[], None]] = None):
        self._fn: Optional[Callable[[], T]] = fn
        self._progress = progress
        self._value: Optional[T] = None
        self.name = name

    @staticmethod
    def ready(value: T, name: str = "ready") -> "Awaitable[T]":
        a: Awaitable[T] = Awaitable(lambda: value, name)
        return a

    def wait(self) -> T:
        if self._fn is not None:
            self.progress()
            with _span(f"neo.wait/{self.name}"):
                self._value = self._guarded(self._fn)
            self._fn = None
        return self._value  # type: ignore[return-value]

    def progress(self) -> None:
        """Run the next stage now, if the awaitable has one (multi-stage collectives: e.g. wait
        for the lengths and send the ids), so that its last stage can travel under compute.
        Idempotent; ``wait()`` runs it first if nobody did. Like every collective step, call it
        at the same point of the program on every rank."""
        if self._progress is not None:
            fn, self._progress = self._progress, None
            with _span(f"neo.progress/{self.name}"):
                self._guarded(fn)

    def _guarded(self, fn: Callable[[], U]) -> U:
        try:
            return fn()
        except RuntimeError as e:
            if isinstance(e, CollectiveError) or not is_comm_error(e):
                raise
            rank = dist.get_rank() if dist.is_initialized() else "?"
            raise CollectiveError(
                f"rank {rank}: collective '{self.name}' failed or timed out: a peer rank has probably "
                f"failed or stalled (see the other ranks' errors). Cause: {e}") from e

    def then(self, fn: Callable[[T], U], name: Optional[str] = None) -> "Awaitable[U]":
        return Awaitable(lambda: fn(self.wait()), name or self.name)


class CommPrecision(str, enum.Enum):
    """Precision of pooled-embedding payloads on the wire."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def wire_dtype(self) -> Optional[torch.dtype]:
        return {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[self.value]


@dataclass(frozen=True)
class CommConfig:
    """Precision of the pooled AlltoAll / ReduceScatter / AllGather payloads."""

    forward: CommPrecision = CommPrecision.FP32
    """Wire precision of pooled embeddings in the forward pass."""
    backward: CommPrecision = CommPrecision.FP32
    """Wire precision of their gradients in the backward pass."""

    def __post_init__(self) -> None:
        for name in ("forward", "backward"):
            v = getattr(self, name)
            try:
                object.__setattr__(self, name, CommPrecision(str(getattr(v, "value", v)).lower()))
            except ValueError:
                raise ValueError(f"comm.{name}: {v!r} is not one of {[p.value for p in CommPrecision]}") from None


# ------------------------------------------------------------------------------ launching
class _Launched:
    """A launched collective: its work handle and the function producing the fp32 result."""

    def __init__(self, work, finish: Callable[[], torch.Tensor]):
        self.work, self.finish = work, finish

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
        return self.finish()


def _cast(x: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    return x.contiguous() if dtype is None else x.to(dtype).contiguous()


def _torch_group(group):
    return group.group if isinstance(group, CommGroup) else group


def _shm_for(group, t: torch.Tensor):
    """The group's shared-memory exchange, if it has one and ``t`` lives on the CPU."""
    return group.shm if isinstance(group, CommGroup) and t.device.type == "cpu" else None


def _launch_a2a(x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int], group,
                dtype: Optional[torch.dtype], in_place: bool = False) -> _Launched:
    """AlltoAll of rows of ``x`` (split along dim 0): ``in_splits[r]`` rows go to rank r.

    ``in_place``: ``x`` is not read again by anyone, so the result may take its memory (see
    :func:`_in_place_output`)."""
    send = _cast(x, dtype)
    shm = _shm_for(group, send)
    tg = _torch_group(group)
    W = dist.get_world_size(tg)
    out = None
    if in_place and (W == 1 or shm is not None):
        out = _in_place_output(send, out_splits, in_splits, dist.get_rank(tg))
    if out is None:
        out = send.new_empty((sum(out_splits),) + tuple(send.shape[1:]))
    if W == 1:
        if out.data_ptr() != send.data_ptr():
            out.copy_(send)
        work = None
    elif shm is not None:
        work = shm.all_to_all_single(out, send, out_splits, in_splits)
    else:
        work = dist.all_to_all_single(out, send, list(out_splits), list(in_splits), group=tg, async_op=True)
    return _Launched(work, lambda: out if dtype is None else out.to(x.dtype))


def _in_place_output(send: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int],
                     me: int) -> Optional[torch.Tensor]:
    """The AlltoAll's output inside ``send``'s own memory, this rank's block where it already
    is, or None where it does not fit there.

    The output's block from rank r (``out_splits[r]`` rows) follows the blocks of the ranks
    before it; placed so that this rank's block coincides with the rows it sends itself, the
    output starts ``sum(in_splits[:me]) - sum(out_splits[:me])`` rows into ``send`` and must end
    inside it (equal splits: the output is ``send``; a rank that sends wider rows than it
    receives fits forward, one that receives wider rows fits backward). Safe with the shared-
    memory exchange (and one rank): it copies every block for a peer into its own segment
    before any peer's block is received, so an incoming block overwrites rows already sent."""
    rest = tuple(send.shape[1:])
    row = math.prod(rest)
    rows = sum(int(s) for s in out_splits)
    start = (sum(int(s) for s in in_splits[:me]) - sum(int(s) for s in out_splits[:me])) * row
    if start < 0 or start + rows * row > send.numel():
        return None
    return send.detach().reshape(-1)[start:start + rows * row].view((rows,) + rest)


def _launch_reduce_scatter(x: torch.Tensor, group, dtype: Optional[torch.dtype]) -> _Launched:
    """Sum over ranks of ``x`` (W * n, ...) ; rank r keeps rows r*n .. (r+1)*n - 1."""
    tg = _torch_group(group)
    W = dist.get_world_size(tg)
    n = x.shape[0] // W
    if dtype is None and (W == 1 or dist.get_backend(tg) != "gloo"):
        send = x.contiguous()
        out = send.new_empty((n,) + tuple(send.shape[1:]))
        if W == 1:
            out.copy_(send)
            return _Launched(None, lambda: out)
        work = dist.reduce_scatter_single(out, send, group=tg, async_op=True)
        return _Launched(work, lambda: out)
    # AlltoAll of the partial sums (16-bit when quantized) and a local fp32 sum. On gloo this is
    # also the fp32 path: gloo's reduce_scatter measured 62 ms vs 32 ms for AlltoAll + sum
    # ((4 x 2048, 512) fp32, W = 4, 2-core CPU); equal at W = 2.
    inner = _launch_a2a(x, [n] * W, [n] * W, group, dtype)
    return _Launched(inner.work, lambda: sum_in_rank_order(inner.finish().view((W, n) + tuple(x.shape[1:]))))


def sum_in_rank_order(parts: torch.Tensor) -> torch.Tensor:
    """``parts`` (W, ...) summed in fp32 as ((p0 + p1) + p2) + ...: the order of the one-host
    distribution's sums (neo.distributed.sharding.one_host), which it matches bit for bit, and
    of the shared-memory gradient AllReduce (neo.distributed.ddp_hook). torch's ``sum(0)`` does
    the same up to W 4, and reorders beyond on small tensors."""
    parts = parts.to(torch.float32)
    if parts.shape[0] == 1:
        return parts[0].clone()
    acc = parts[0] + parts[1]
    for q in range(2, parts.shape[0]):
        acc.add_(parts[q])
    return acc


def _launch_all_gather(x: torch.Tensor, group, dtype: Optional[torch.dtype]) -> _Launched:
    tg = _torch_group(group)
    W = dist.get_world_size(tg)
    send = _cast(x, dtype)
    out = send.new_empty((W * send.shape[0],) + tuple(send.shape[1:]))
    shm = _shm_for(group, send)
    if W == 1:
        out.copy_(send)
        work = None
    elif shm is not None:
        work = shm.all_gather_single(out, send)
    else:
        work = dist.all_gather_single(out, send, group=tg, async_op=True)
    return _Launched(work, lambda: out if dtype is None else out.to(x.dtype))


def all_to_all(x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int], group,
               name: str = "all_to_all") -> Awaitable[torch.Tensor]:
    """Plain (non-differentiable) AlltoAll of ``x`` along dim 0; for lengths and ids."""
    launched = _launch_a2a(x, out_splits, in_splits, group, None)
    return Awaitable(launched.wait, name)


def all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM, name: str = "all_reduce") -> Awaitable[torch.Tensor]:
    """In-place AllReduce of ``x``; the awaitable returns ``x``."""
    group = _torch_group(group)
    if dist.get_world_size(group) == 1:
        return Awaitable.ready(x, name)
    work = dist.all_reduce(x, op=op, group=group, async_op=True)

    def finish() -> torch.Tensor:
        work.wait()
        return x

    return Awaitable(finish, name)


# ------------------------------------------------------------------- differentiable pairs
class BackwardOrder:
    """Token chain that fixes the order of backward collectives (see module docstring).

    One per forward pass; pass the same object to every differentiable collective of it.
    ``timers`` (``timers(name)`` a context manager, e.g. :class:`neo.train.step.Timers`): the
    backward collectives' launches and waits are timed as ``output_dist_bwd``.
    """

    def __init__(self, timers: Optional[Callable[[str], Any]] = None) -> None:
        self.token: Optional[torch.Tensor] = None
        self.timers = timers


@contextlib.contextmanager
def _untimed(_name: str):
    yield


class _Request:
    def __init__(self, forward: Callable[[torch.Tensor], _Launched], backward: Callable[[torch.Tensor], _Launched],
                 timers: Optional[Callable[[str], Any]] = None):
        self.forward, self.backward = forward, backward
        self.pending: Optional[_Launched] = None
        self.grad_pending: Optional[_Launched] = None
        self.timed = timers if timers is not None else _untimed


class _Start(torch.autograd.Function):
    """Launches the forward collective; its backward waits for the reverse collective."""

    @staticmethod
    def forward(ctx, req: _Request, x: torch.Tensor):
        ctx.req = req
        req.pending = req.forward(x)
        return x.new_empty(0)                                   # dummy: links Start and Wait in the graph

    @staticmethod
    def backward(ctx, _grad_dummy):
        with ctx.req.timed("output_dist_bwd"):
            grad = ctx.req.grad_pending.wait()
        ctx.req.grad_pending = None
        return None, grad


class _Wait(torch.autograd.Function):
    """Waits for the forward collective; its backward launches the reverse collective."""

    @staticmethod
    def forward(ctx, req: _Request, dummy: torch.Tensor, prev_token: Optional[torch.Tensor]):
        ctx.req, ctx.has_prev = req, prev_token is not None
        out = req.pending.wait()
        req.pending = None
        return out, dummy.new_empty(0)

    @staticmethod
    def backward(ctx, grad_out, _grad_token):
        with ctx.req.timed("output_dist_bwd"):
            ctx.req.grad_pending = ctx.req.backward(grad_out.contiguous())
        return None, grad_out.new_empty(0), (grad_out.new_empty(0) if ctx.has_prev else None)


def _differentiable(x: torch.Tensor, forward: Callable[[torch.Tensor], _Launched],
                    backward: Callable[[torch.Tensor], _Launched], order: Optional[BackwardOrder],
                    name: str) -> Awaitable[torch.Tensor]:
    req = _Request(forward, backward, None if order is None else order.timers)
    if torch.is_grad_enabled() and not x.requires_grad:
        # a rank with nothing to differentiate here must still join the backward collective
        x = x.detach().requires_grad_()
    with _span(f"neo.launch/{name}"):
        dummy = _Start.apply(req, x)

    def finish() -> torch.Tensor:
        out, token = _Wait.apply(req, dummy, None if order is None else order.token)
        if order is not None and token.requires_grad:
            order.token = token
        return out

    return Awaitable(finish, name)


def all_to_all_pooled(x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int], group,
                      comm: CommConfig = CommConfig(), order: Optional[BackwardOrder] = None,
                      name: str = "pooled_all_to_all", consume: bool = False) -> Awaitable[torch.Tensor]:
    """Differentiable AlltoAll of rows of ``x`` (n, D); backward: AlltoAll with the splits swapped.

    ``consume``: nobody reads ``x`` after the call, nor the gradient of the result after the
    backward hands it here (a sharded collection's pooled output and the gradient its consumer
    computes for it): where the result fits in that memory (:func:`_in_place_output`), each
    AlltoAll runs in place, without copying this rank's own block."""
    fwd, bwd = comm.forward.wire_dtype, comm.backward.wire_dtype
    out_s, in_s = list(out_splits), list(in_splits)
    return _differentiable(
        x,
        lambda t: _launch_a2a(t, out_s, in_s, group, fwd, in_place=consume),
        lambda g: _launch_a2a(g, in_s, out_s, group, bwd, in_place=consume),
        order, name,
    )


def reduce_scatter_pooled(x: torch.Tensor, group, comm: CommConfig = CommConfig(),
                          order: Optional[BackwardOrder] = None,
                          name: str = "pooled_reduce_scatter") -> Awaitable[torch.Tensor]:
    """Differentiable ReduceScatter (sum) of ``x`` (W * n, D) over dim 0; backward: AllGather."""
    fwd, bwd = comm.forward.wire_dtype, comm.backward.wire_dtype
    return _differentiable(
        x,
        lambda t: _launch_reduce_scatter(t, group, fwd),
        lambda g: _launch_all_gather(g, group, bwd),
        order, name,
    )


def slice_local_pooled(x: torch.Tensor, group, comm: CommConfig = CommConfig(),
                       order: Optional[BackwardOrder] = None,
                       name: str = "pooled_slice_local") -> Awaitable[torch.Tensor]:
    """Forward: rows ``rank*n .. (rank+1)*n - 1`` of ``x`` (W * n, D), no communication.

    Backward: AllGather of the (n, D) gradients, so that every rank sees the gradient of
    every rank's samples (data-parallel replicas then apply the same global update).
    """
    tg = _torch_group(group)
    W, rank = dist.get_world_size(tg), dist.get_rank(tg)
    n = x.shape[0] // W
    bwd = comm.backward.wire_dtype
    return _differentiable(
        x,
        lambda t: _Launched(None, lambda: t[rank * n:(rank + 1) * n].clone()),
        lambda g: _launch_all_gather(g, group, bwd),
        order, name,
    )


def slice_local_varlen(x: torch.Tensor, sizes: Sequence[int], group, comm: CommConfig = CommConfig(),
                       order: Optional[BackwardOrder] = None,
                       name: str = "slice_local_varlen") -> Awaitable[torch.Tensor]:
    """:func:`slice_local_pooled` for blocks of unequal sizes: ``x`` holds every rank's block,
    ``sizes[r]`` rows of rank r, in rank order; forward: this rank's block, no communication.

    Backward: every rank's gradient block to every rank (an AlltoAll carrying the same block for
    each: AllGather has no unequal blocks), so that each rank gets the gradient of all of ``x``."""
    tg = _torch_group(group)
    W, rank = dist.get_world_size(tg), dist.get_rank(tg)
    sizes = [int(n) for n in sizes]
    start, n = sum(sizes[:rank]), sizes[rank]
    bwd = comm.backward.wire_dtype
    return _differentiable(
        x,
        lambda t: _Launched(None, lambda: t[start:start + n].clone()),
        lambda g: _launch_a2a(g.repeat((W,) + (1,) * (g.dim() - 1)), sizes, [n] * W, group, bwd,
                              in_place=True),        # the repeated blocks are no one else's
        order, name,
    )
