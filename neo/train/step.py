"""One training step's compute, and the phase timers.

:class:`DenseStep` is the module DistributedDataParallel wraps. Its forward takes a batch whose
ids were already redistributed (``input_dist`` ran ahead, in the pipeline) and overlaps the
pooled-embedding AlltoAll with the bottom MLP (Neo paper, section on the training pipeline)::

    pooled_aw = emb.output_dist(emb.compute(dist_batch), dist_batch)   # AlltoAll launched
    x = model.bottom(dense)                                            # runs under it
    pooled = pooled_aw.wait()
    logits = top(interaction(x, pooled))

DDP wraps this step module (not ``DLRM`` itself, whose ``forward`` would redistribute the ids
again): DDP's reducer averages the dense gradients over ``pg.dense``; the sharded collection's
buffers are excluded from DDP (shards differ per rank and train through their fused
optimizers), as :func:`neo.distributed.parallelize` does.
"""

from __future__ import annotations

import time
import warnings
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from neo.distributed.ddp_hook import register_shm_allreduce

__all__ = ["DenseStep", "Timers", "wrap_ddp"]


class Timers:
    """Wall-clock seconds per named phase, summed (``with timers("lookup"): ...``).

    Also where the rank is: ``current`` names the innermost phase running now (heartbeats report
    it), ``failed_in`` the innermost phase an exception left (errors name it).

    ``trace``: a :class:`neo.train.trace.TraceRecorder` (``train.trace``) makes every timed phase
    a span of the timeline, on the thread that ran it; :meth:`begin` / :meth:`end` record work in
    flight between two points (no-ops without a recorder)."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = defaultdict(float)
        self._stack: List[str] = []
        self.failed_in: Optional[str] = None
        self.trace = None

    @property
    def current(self) -> str:
        stack = self._stack
        return stack[-1] if stack else ""

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        self._stack.append(name)
        try:
            yield
        except BaseException:
            if self.failed_in is None:
                self.failed_in = name
            raise
        finally:
            self._stack.pop()
            t1 = time.perf_counter()
            self.seconds[name] += t1 - t0
            if self.trace is not None:
                self.trace.add(name, None, t0, t1)

    def begin(self, name: str, lane: str):
        """Open a span of work in flight on ``lane`` (the timeline only; None without a recorder)."""
        return None if self.trace is None else self.trace.begin(name, lane)

    def end(self, token) -> None:
        if token is not None:
            self.trace.end(token)

    def reset(self) -> None:
        self.seconds.clear()

    def snapshot(self) -> Dict[str, float]:
        return {k: round(v, 4) for k, v in self.seconds.items()}


class DenseStep(nn.Module):
    """``forward(dense, dist_batch) -> logits (B,)`` of a DLRM whose embedding is sharded.

    ``overlap=False`` waits for the pooled embeddings before the bottom MLP (the plain order);
    the arithmetic is identical either way. ``dense_dtype=torch.bfloat16`` runs the MLPs and the
    interaction under autocast (bf16 matmuls, fp32 master weights and embeddings); the default
    fp32 runs them in fp32.
    """

    def __init__(self, model: nn.Module, timers: Timers, overlap: bool = True,
                 dense_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.model = model
        self.timers = timers
        self.overlap = overlap
        self.dense_dtype = dense_dtype

    def _autocast(self, device_type: str):
        return torch.autocast(device_type, dtype=self.dense_dtype, enabled=self.dense_dtype != torch.float32)

    def forward(self, dense: torch.Tensor, dist_batch) -> torch.Tensor:
        m, t = self.model, self.timers
        emb = m.embedding
        with t("lookup"):
            pooled_local = emb.compute(dist_batch)                     # (W * B, local columns)
        with t("output_dist"):
            pooled_aw = emb.output_dist(pooled_local, dist_batch,      # AlltoAll / ReduceScatter launched
                                        pieces=getattr(m.interaction, "accepts_pooled_pieces", False))
            if not self.overlap:
                pooled_aw.wait()
        with t("dense_fwd"), self._autocast(dense.device.type):
            x = m.bottom(dense)                                        # (B, D) under the AlltoAll
        with t("output_dist"):
            pooled = pooled_aw.wait()                                  # (B, F * D), or PooledPieces of it
        with t("dense_fwd"), self._autocast(dense.device.type):
            z = m.interaction(x, pooled)
            return m.top(z).squeeze(1).float()                         # (B,)


def wrap_ddp(step: DenseStep, pg) -> DistributedDataParallel:
    """DDP over ``pg.dense`` on the dense parameters only (the sharded collection ignored); its
    gradient AllReduce through shared memory where the ranks share a host (:mod:`neo.distributed.ddp_hook`)."""
    emb = step.model.embedding
    ignore = [f"model.embedding.{n}" for n, _ in emb.named_buffers()]
    ignore += [f"model.embedding.{n}" for n, _ in emb.named_parameters()]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(step, ignore)
    with warnings.catch_warnings():   # broadcast_buffers=False is what we mean (shards are rank-local)
        warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
        ddp = DistributedDataParallel(step, process_group=pg.dense, broadcast_buffers=False,
                                      gradient_as_bucket_view=True)
    on_cpu = all(p.device.type == "cpu" for p in ddp.parameters())
    register_shm_allreduce(ddp, pg.dense_comm.shm if on_cpu else None)   # CPU ranks of one host
    return ddp
