"""PipeDream's profiler (Narayanan et al. SOSP 2019, section 3.1): each dense layer's time and bytes on this device.

For every layer of :mod:`neo.pipeline.layers`, at batch size B: the forward and the backward
time (median of ``repeats`` runs after warm-up runs; the backward is timed on its own, from
the layer's output gradients to its input and parameter gradients), the bytes of its output
tuple (what a stage ending with it sends) and of its parameters. Inputs are random tensors of
the right shapes, each layer fed the previous layer's outputs; they require gradients as a
stage's received activations do (all but the raw dense features).

The point-to-point bandwidth between stages comes from, in this order: the caller
(``--bandwidth-gbps``), a measurement (:func:`measure_p2p_bandwidth`: gloo send/recv of a few MB
between 2 local processes, a few seconds), or the planner's cost constants (``intra_bw``: this
machine's calibration file, else the device kind's defaults; ``neo calibrate``).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from neo.models.mlp import splitting_backward
from neo.pipeline.partition import LayerProfile, Profile

__all__ = ["profile_layers", "profile_chunks", "ChunkProfile", "measure_p2p_bandwidth", "bandwidth_from_constants",
           "build_profile", "tensor_bytes"]


def tensor_bytes(acts: Sequence[torch.Tensor]) -> int:
    """Bytes of a tuple of tensors."""
    return sum(t.numel() * t.element_size() for t in acts)


def _timed(fn: Callable[[], object], device: torch.device, clock: Callable[[], float] = time.perf_counter) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = clock()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (clock() - t0) * 1e3


def _profile_one(name: str, layer: nn.Module, inputs: Tuple[torch.Tensor, ...], repeats: int, warmup: int,
                 device: torch.device) -> Tuple[LayerProfile, Tuple[torch.Tensor, ...]]:
    params = [p for p in layer.parameters() if p.requires_grad]
    with torch.no_grad():
        sample = layer(*inputs)
    grads = tuple(torch.randn_like(t) for t in sample)
    fwd, bwd = [], []
    for k in range(warmup + repeats):
        for t in list(inputs) + params:
            t.grad = None
        box: List[Tuple[torch.Tensor, ...]] = []
        f_ms = _timed(lambda: box.append(layer(*inputs)), device)
        outs = box[0]
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
        b_ms = _timed(lambda: torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs]), device)
        if k >= warmup:
            fwd.append(f_ms)
            bwd.append(b_ms)
    for p in params:                                        # leave no gradients behind
        p.grad = None
    row = LayerProfile(name, statistics.median(fwd), statistics.median(bwd), tensor_bytes(sample),
                       sum(p.numel() * p.element_size() for p in layer.parameters()))
    nxt = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in sample)
    return row, nxt


def profile_layers(layers: Sequence[Tuple[str, nn.Module]], batch_size: int, num_dense: int, pooled_width: int,
                   repeats: int = 10, warmup: int = 3, device: Optional[torch.device] = None,
                   seed: int = 0) -> List[LayerProfile]:
    """Measure every layer of ``layers`` (forward order, :func:`neo.pipeline.layers.dense_layers`)
    at ``batch_size`` on ``device``; ``pooled_width`` = F * D. The layers are moved to ``device``
    and left without gradients; their weights are not changed."""
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"batch_size and repeats must be >= 1 and warmup >= 0, got {batch_size}, {repeats}, {warmup}")
    device = device or torch.device("cpu")
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch_size, num_dense, generator=g).to(device)                        # (B, num_dense)
    pooled = torch.randn(batch_size, pooled_width, generator=g).to(device).requires_grad_()   # (B, F * D)
    acts: Tuple[torch.Tensor, ...] = (dense, pooled)
    rows = []
    for name, layer in layers:
        layer.to(device)
        row, acts = _profile_one(name, layer, acts, repeats, warmup, device)
        rows.append(row)
    return rows


@dataclass(frozen=True)
class ChunkProfile:
    """One pipeline chunk (a stage's run of layers) timed as a stage runs it, ms per micro-batch."""

    fwd_ms: float
    bwd_ms: float
    """The whole backward (the schedules but zero bubble)."""
    input_grad_ms: float
    """Zero bubble's input pass (0 on the first chunk, which has none)."""
    weight_grad_ms: float
    """Zero bubble's weight pass (on the first chunk: its whole backward)."""


def profile_chunks(chunks: Sequence[nn.Module], batch_size: int, num_dense: int, pooled_width: int,
                   repeats: int = 5, warmup: int = 2, device: Optional[torch.device] = None,
                   seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> List[ChunkProfile]:
    """Every chunk of a split, timed whole at ``batch_size``: forward, backward, and the backward as
    zero-bubble schedules split it. Medians over ``repeats`` after ``warmup``.

    The partitioner works on the layers' own times (:func:`profile_layers`); a chunk run whole costs
    more than the sum of its layers' times (one autograd graph through all of them, all their
    activations alive; 10-30% on the deep MLP of ``tools/bench_pipeline.py`` at 64 samples), so a
    prediction for a chosen split reads these. ``chunks`` are the modules as the stages run them
    (:class:`~neo.pipeline.stages.ContiguousOutputs`), fed the previous chunk's outputs (the first:
    random dense features and pooled rows; the last ends in a BCE-with-logits loss).

    Zero bubble: torch's schedules (``backward_one_chunk(full_backward=False)``, then
    ``backward_weight_one_chunk``) run ``stage_backward_input`` (input gradients; the gradients at
    the nodes where weights branch off are kept) and later ``stage_backward_weight`` (the weight
    gradients from those nodes), except on the first stage, which skips the input pass and runs
    its whole backward as the weight pass. Timed with those same functions, on the chunk's
    :class:`~neo.models.mlp.Linear` layers set to ``split_backward`` as the zero-bubble pipeline
    sets them (else each pass computes both gradients: two backwards); where this torch has none,
    both are the backward's halves.

    ``clock``: wall time by default; ``time.process_time`` gives the CPU each call costs, which is
    what to measure while more processes than cores run at once (every rank profiling together, as
    they will run): the time-slicing drops out, and the slowdown they cause each other stays in.
    """
    try:
        from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    except ImportError:                                                     # pragma: no cover
        stage_backward_input = stage_backward_weight = None
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"batch_size and repeats must be >= 1 and warmup >= 0, got {batch_size}, {repeats}, {warmup}")
    device = device or torch.device("cpu")
    g = torch.Generator().manual_seed(seed)
    acts: Tuple[torch.Tensor, ...] = (torch.randn(batch_size, num_dense, generator=g).to(device),
                                      torch.randn(batch_size, pooled_width, generator=g).to(device).requires_grad_())
    labels = torch.randint(0, 2, (batch_size,), generator=g).float().to(device)
    out: List[ChunkProfile] = []
    for k, chunk in enumerate(chunks):
        chunk.to(device)
        params = [p for p in chunk.parameters() if p.requires_grad]
        last = k == len(chunks) - 1
        with torch.no_grad():
            sample = chunk(*acts)
        grads = tuple(torch.randn_like(t) for t in sample)

        def backward_of(outs):                      # (outputs or loss, their gradients or None)
            if last:
                logits = outs[0] if isinstance(outs, (tuple, list)) else outs
                return [F.binary_cross_entropy_with_logits(logits.reshape(-1).float(), labels)], None
            pairs = [(o, g_) for o, g_ in zip(outs, grads) if o.requires_grad]
            return [o for o, _ in pairs], [g_ for _, g_ in pairs]

        times: List[List[float]] = [[], [], [], []]
        for r in range(warmup + repeats):
            for t in list(acts) + params:
                t.grad = None
            box: List[object] = []
            f_ms = _timed(lambda: box.append(chunk(*acts)), device, clock)
            outs, ograds = backward_of(box[0])
            b_ms = _timed(lambda: torch.autograd.backward(outs, ograds), device, clock)
            for t in list(acts) + params:
                t.grad = None
            with splitting_backward(chunk):                 # as TorchPipeline runs zero bubble
                outs, ograds = backward_of(chunk(*acts))
                if stage_backward_input is None:
                    i_ms, w_ms = (0.0, b_ms) if k == 0 else (b_ms / 2, b_ms / 2)
                elif k == 0:
                    i_ms, w_ms = 0.0, _timed(lambda: torch.autograd.backward(outs, ograds), device, clock)
                else:
                    groups: List[object] = []
                    i_ms = _timed(lambda: groups.append(stage_backward_input(outs, ograds, list(acts),
                                                                             iter(params))[1]), device, clock)
                    w_ms = _timed(lambda: stage_backward_weight(iter(params), groups[0]), device, clock)
            if r >= warmup:
                for lst, x in zip(times, (f_ms, b_ms, i_ms, w_ms)):
                    lst.append(x)
        for t in list(acts) + params:                       # leave no gradients behind
            t.grad = None
        out.append(ChunkProfile(*(statistics.median(x) for x in times)))
        acts = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in sample)
    return out


# ----------------------------------------------------------------------------- bandwidth
def one_way_seconds(rank: int, nbytes: int, repeats: int, warmup: int = 1) -> Optional[float]:
    """Median one-way time (s) of a gloo send of ``nbytes`` between ranks 0 and 1 of the default
    group: ping-pong round trips halved, after ``warmup`` unmeasured ones. Collective: ranks
    above 1 wait at its barriers and get None."""
    import torch.distributed as dist

    buf = torch.zeros(max(1, nbytes // 4))
    times = []
    dist.barrier()
    if rank < 2:
        for k in range(warmup + repeats):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if k >= warmup:
                times.append((time.perf_counter() - t0) / 2)
    dist.barrier()
    return statistics.median(times) if times else None


def _bandwidth_worker(rank: int, port: int, nbytes: int, repeats: int, out) -> None:
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        t = one_way_seconds(rank, nbytes, repeats)     # the first round trip warms the connection up
        if rank == 0:
            out.put(t)
    finally:
        dist.destroy_process_group()


def measure_p2p_bandwidth(nbytes: int = 4 << 20, repeats: int = 5, timeout_s: float = 60.0) -> float:
    """GB/s of a gloo send/recv of ``nbytes`` between 2 local processes (median of ``repeats``
    round trips, halved). Raises RuntimeError when the processes fail or time out."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_bandwidth_worker, args=(r, port, nbytes, repeats, out), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        one_way_s = out.get(timeout=timeout_s)
    except Exception:
        raise RuntimeError("gloo send/recv between 2 local processes failed or timed out") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return nbytes / one_way_s / 1e9


def bandwidth_from_constants(cfg) -> Tuple[float, str]:
    """(GB/s, what) from the planner's cost constants of ``cfg`` (``intra_bw``, 2 ranks)."""
    consts, what = cfg.cost_constants(2)
    return consts.intra_bw / 1e9, f"planner cost constants intra_bw ({what})"


def build_profile(rows: Sequence[LayerProfile], bandwidth_gbps: float, **meta) -> Profile:
    """A :class:`Profile` of measured rows, with metadata (batch size, device, sources)."""
    return Profile(tuple(rows), float(bandwidth_gbps), dict(meta))
