"""The measuring side of tools/bench_pipeline.py, what each rank runs and times with: the
benchmark's model (DLRM with a deep top MLP, :func:`_model`; with ``hollow`` the null model, every
Linear a :class:`_Hollow`), its tables and batches, the partitioner's split of a layer profile, the
gloo probes (one-way point-to-point time, gradient AllReduce time), the timers that also count
process CPU (:class:`_CpuTimers`) and the median the reports take. The model side, pure functions
of these measurements, is tools/pipeline_prediction.py (used by the benchmark run as a script:
tools/ is on sys.path)."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import List

F, D, NUM_DENSE = 8, 16, 13
"""The model's sparse features (one table each), their embedding dimension, its dense features."""


class _Hollow:
    """A Linear's forward with its output's shape and no product: ``(B, in) -> (B, out)`` as one
    broadcast multiply by a (1, out) slice of the weight (autograd through it, a gradient for the
    weight). The null model's layers: the runtime's own work at the real activation sizes (the
    transfers, copies and buffers of every action), next to no arithmetic. It replaces both ways a
    :class:`neo.models.mlp.Linear` runs: ``forward`` and, for a Linear followed by a ReLU,
    ``forward_relu`` (:meth:`relu`; the pipeline's layers call it, except under zero bubble's
    ``split_backward``, which goes through ``forward``), so the null model computes the same under
    every schedule and in its chunk profile."""

    def __init__(self, linear) -> None:
        self.linear = linear

    def __call__(self, x):
        w = self.linear.weight                          # (out, in)
        return x[:, :1] * w[:, 0].unsqueeze(0) + self.linear.bias

    def relu(self, x):
        """``forward_relu``'s stand-in: the hollow layer, then the ReLU."""
        import torch

        return torch.relu(self(x))


def _model(args, embedding, hollow: bool = False):
    import torch

    from neo.models import DLRM
    from neo.models.mlp import Linear

    torch.manual_seed(0)
    model = DLRM(embedding, F, D, NUM_DENSE, [64, D], [args.width] * args.top_layers + [1])
    if hollow:                        # the null model: the same shapes, hollow layers
        for m in model.modules():
            if isinstance(m, (Linear, torch.nn.Linear)):
                m.forward = _Hollow(m)
                if isinstance(m, Linear):     # its Linear + ReLU step too (linear_activation), else
                    m.forward_relu = m.forward.relu     # only zero bubble's (split_backward) would be hollow
    return model


def _tables():
    from neo.config.embedding import OptimizerConfig, TableConfig

    return [TableConfig(f"t{i}", num_rows=1000, dim=D, optimizer=OptimizerConfig("rowwise_adagrad", lr=0.05))
            for i in range(F)]


def _batch(args, rank: int, W: int, gen):
    import torch

    from neo.sparse import KeyedJaggedBatch

    B = args.batch
    ids = torch.randint(0, 1000, (F * B,), generator=gen)
    sparse = KeyedJaggedBatch(tuple(f"t{i}" for i in range(F)), ids, torch.ones(F * B, dtype=torch.int64), B)
    return torch.randn(B, NUM_DENSE, generator=gen), sparse, torch.randint(0, 2, (B,), generator=gen).float()


def _split(profile, chunks: int):
    from neo.pipeline.partition import partition

    return [list(s) for s in partition(profile, chunks).stages]


def _one_way_ms(rank: int, nbytes: int, repeats: int = 20) -> float:
    """Median one-way time of a ``nbytes`` gloo send between ranks 0 and 1 (ping-pong / 2), ms;
    collective (every rank calls it; ranks above 1 wait at the barrier)."""
    from neo.pipeline.profile import one_way_seconds

    return 1e3 * (one_way_seconds(rank, nbytes, repeats, warmup=2) or 0.0)


def _allreduce_ms(part_bytes: List[int], group=None, repeats: int = 10, warmup: int = 3) -> float:
    """Median time of a gradient AllReduce as the runs do one: the parts (``part_bytes``, fp32)
    flattened into one buffer, then a gloo AllReduce over ``group`` (the ranks lined up by a barrier
    before each), ms; collective over the default group."""
    import torch
    import torch.distributed as dist

    parts = [torch.zeros(max(1, n // 4)) for n in part_bytes if n > 0] or [torch.zeros(1)]
    times = []
    for k in range(warmup + repeats):
        dist.barrier()
        t0 = time.perf_counter()
        flat = torch.cat([t.reshape(-1) for t in parts])
        dist.all_reduce(flat, group=group)
        if k >= warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


class _CpuTimers:
    """neo.train.step.Timers that also sum each phase's process CPU seconds (every thread of the
    rank: its compute, the runtime, gloo's transfers) into ``cpu``."""

    def __init__(self) -> None:
        from neo.train.step import Timers

        self.wall, self.cpu = Timers(), {}

    @property
    def seconds(self):
        return self.wall.seconds

    def reset(self) -> None:
        self.wall.reset()
        self.cpu = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        c0 = time.process_time()
        try:
            with self.wall(name):
                yield
        finally:
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c0


def _median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
