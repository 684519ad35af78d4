"""Pipeline-parallel dense towers with sharded embeddings: the step :class:`neo.train.trainer.Trainer`
runs when ``parallel.pipeline.stages > 1``.

Launch (``neo train`` dispatches on the config; 4 ranks = 2 stages x 2 replicas here)::

    neo train configs/pipeline_deep_mlp.yaml          # relaunched under torchrun, one rank per stage
    torchrun --standalone --nproc-per-node 4 -m neo.train configs/pipeline_deep_mlp.yaml
    torchrun --standalone --nproc-per-node 4 -m neo.train configs/pipeline_dcn.yaml parallel.pipeline.schedule=chimera
    torchrun --standalone --nproc-per-node 2 -m neo.train configs/pipeline_deep_mlp.yaml \
        parallel.pipeline.schedule=pipedream_async          # or pipedream_2bw (async_schedules.py)

One step on rank r (position p of its pipeline replica; docs/pipeline.md, "Execution")::

    1. lookup + output_dist        every rank, its own B samples: pooled (B, F D), as without a pipeline
    2. route (route.py)            pooled rows + dense -> the first chunk's position, labels -> the last's
    3. schedule (schedules.py,     the chunks run the replica's S B samples in M micro-batches;
       chimera.py,                 the first chunk's input gradient accumulates in a pooled leaf
       async_schedules.py)         (pipedream_async: each stage's dense update after every backward)
    4. route back                  each position receives its rows of that gradient
    5. embedding backward          pooled.backward(S x grad): the sharded collection's gradient
                                   AlltoAlls and fused updates, over all W ranks
    6. gradient sync               each chunk's gradients summed over its copies, divided by R
    7. dense optimizer             on this rank's chunks only (pipedream_async: done in step 3)

Gradient scale: a micro-batch's loss is its BCE sum over the replica's S B samples
(:class:`~neo.pipeline.stages.ReplicaLoss`), so the chunks' gradients add up to the replica
batch's mean; the AllReduce over the R replicas divided by R gives the global batch's mean.
The pooled gradient is d(replica mean)/d(pooled) = d(rank mean)/d(pooled) / S, and the sharded
collection scales what it receives by 1/W as for DDP's per-rank mean, hence the factor S.
Every rank holds the whole dense model (built from the same seed) but trains its chunks only;
:meth:`PipelinedDense.sync_weights` copies the trained chunks to every rank of the replica
before an evaluation, which then runs unchanged (the whole dense model on each rank's samples).

Position weights (``model.position_weights``) belong to the lookup, which every rank runs on its
own samples (step 1): every rank trains them. Their gradient comes from step 5 (the sharded
collection's, times W, as under DDP) and is averaged over all W ranks in step 6; the optimizer
updates them on every rank alike. Not with ``pipedream_async``, which steps the optimizer inside
the schedule, before step 5.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from neo.config.embedding import ConfigError
from neo.config.parallel import PipelineConfig
from neo.distributed.process_groups import on_rank0
from neo.machine import usable_cores
from neo.pipeline.async_schedules import ASYNC_SCHEDULES, AsyncPipeline
from neo.pipeline.chimera import ChimeraPipeline
from neo.pipeline.layers import layers_of, split_stages
from neo.pipeline.mesh import DOWN, PipelineGroups, PipelineMesh
from neo.pipeline.route import SampleRouter
from neo.pipeline.schedules import TorchPipeline
from neo.pipeline.stages import BusyMeter, ContiguousOutputs, ReplicaLoss

__all__ = ["PipelinedDense", "check_pipelined_train", "pipelined_dense", "plan_pipeline"]


def _null_timer(name: str):
    return contextlib.nullcontext()


def plan_pipeline(cfg: PipelineConfig, layers: Sequence[Tuple[str, nn.Module]], micro_batch: int, num_dense: int,
                  pooled_width: int, bandwidth_gbps: float = 1.0, cores: int = 0,
                  threads_per_rank: int = 1, replicas: int = 1) -> Tuple[List[Tuple[int, int]], str]:
    """(``[first, last]`` layers of every chunk, schedule name) of a pipeline config.

    ``split: auto`` and ``schedule: auto`` measure the layers here at the micro-batch size
    (:func:`neo.pipeline.profile.profile_layers`); the partitioner
    (:func:`neo.pipeline.partition.partition`) cuts the profile into ``stages x virtual_stages``
    chunks, which are timed whole (:func:`neo.pipeline.profile.profile_chunks`), and the
    performance model (:func:`neo.pipeline.simulate.best_replayed`: each schedule's order of
    actions replayed) picks the fastest schedule the config's shape allows (``cores``: the CPU
    cores of the ranks' hosts, where they may outnumber them, shared by the ``replicas`` copies
    of the pipeline; 0 on accelerators). An explicit split and schedule are taken as they are."""
    from neo.pipeline.partition import Partition, partition
    from neo.pipeline.perf_model import stage_times
    from neo.pipeline.simulate import best_replayed, chunk_costs
    from neo.pipeline.profile import build_profile, profile_chunks, profile_layers

    auto_split, auto_schedule = isinstance(cfg.split, str), cfg.schedule == "auto"
    if not (auto_split or auto_schedule):
        return [(int(a), int(b)) for a, b in cfg.split], cfg.schedule
    rows = profile_layers(layers, micro_batch, num_dense, pooled_width, repeats=5, warmup=2)
    for _, layer in layers:                               # the profiler's backward left gradients
        for p in layer.parameters():
            p.grad = None
    profile = build_profile(rows, bandwidth_gbps, batch_size=micro_batch)
    if auto_split:
        part = partition(profile, cfg.chunks)
    else:
        bounds = [(int(a), int(b)) for a, b in cfg.split]
        part = Partition(bounds, [0.0] * len(bounds), 0.0, [1] * len(bounds))
    split = [tuple(b) for b in part.stages]
    if not auto_schedule:
        return split, cfg.schedule
    S, v, M = int(cfg.stages), int(cfg.virtual_stages), int(cfg.micro_batches)
    t = stage_times(profile, part)
    # the chunks timed whole as the stages will run them (more than their layers' sum), and zero
    # bubble's two backward passes as torch splits them
    timed = profile_chunks([ContiguousOutputs(c) for c in split_stages(layers, split)], micro_batch, num_dense,
                           pooled_width, repeats=5, warmup=2)
    costs = chunk_costs(timed)
    candidates = ["1f1b", "gpipe", "zero_bubble"] if v == 1 else ["interleaved_1f1b", "zero_bubble"]
    if v == 1 and S % 2 == 0 and M % 2 == 0:
        candidates.append("chimera")
    return split, best_replayed(candidates, costs, M, S, v, comm_ms=t.comm_ms, cores=cores,
                                threads_per_rank=threads_per_rank, replicas=replicas)[0]


def check_pipelined_train(cfg) -> None:
    """The ``train`` settings a pipelined dense tower cannot honour: a ConfigError naming the field
    (``neo train`` checks them before it launches the stages' ranks, each rank again at start)."""
    t = cfg.train
    if t.dense_dtype != "fp32":
        raise ConfigError(f"train.dense_dtype: the pipelined dense towers run in fp32, got {t.dense_dtype!r} "
                          "(or set parallel.pipeline.stages: 1)")
    if t.checkpoint_dir:
        raise ConfigError("train.checkpoint_dir: checkpoints are not supported with parallel.pipeline.stages > 1 "
                          "yet (each rank's dense optimizer holds the state of its own chunks only)")


def pipelined_dense(cfg, model: nn.Module, pg, num_dense: int, log=print) -> "PipelinedDense":
    """The :class:`PipelinedDense` of a whole :class:`~neo.config.NeoConfig` (``neo train``), after
    the rules the pipeline adds across sections; ``log`` gets one line saying what runs where."""
    t = cfg.train
    check_pipelined_train(cfg)
    from neo.pipeline.profile import bandwidth_from_constants

    bandwidth = bandwidth_from_constants(cfg)[0]
    pipe = PipelinedDense(cfg.parallel.pipeline, model, pg, t.batch_size, num_dense, model.embedding.output_dim,
                          bandwidth_gbps=bandwidth)
    m = pipe.mesh
    log(f"neo train: dense layers pipelined over {m.stages} stages x {m.replicas} replicas, schedule "
        f"{pipe.schedule_name}, {cfg.parallel.pipeline.micro_batches} micro-batches of {pipe.micro_batch}, "
        f"chunks {[list(c) for c in pipe.split]} of {len(pipe.layers)} layers")
    return pipe


class PipelinedDense:
    """The dense part of ``model`` (a :class:`~neo.models.DLRM` on a sharded embedding), pipelined.

    Collective to build (every rank, same point): it creates the pipeline's process groups.

    Args:
        cfg: ``parallel.pipeline`` (validated; :meth:`PipelineConfig.check` runs here).
        model: the DLRM, identical dense weights on every rank (same seed).
        pg: :class:`~neo.distributed.ProcessGroups` (world size, timeout).
        batch_size: B, samples per rank and step.
        num_dense: dense features per sample; ``pooled_width``: F D.
        bandwidth_gbps: point-to-point bandwidth between stages for ``split: auto`` (GB/s).
    """

    def __init__(self, cfg: PipelineConfig, model: nn.Module, pg, batch_size: int, num_dense: int, pooled_width: int,
                 bandwidth_gbps: float = 1.0):
        self.cfg, self.model, self.B = cfg, model, batch_size
        self.num_dense, self.pooled_width = num_dense, pooled_width
        W = pg.world_size
        self.layers = layers_of(model)
        cfg.check(len(self.layers), batch_size, W)
        S, M = int(cfg.stages), int(cfg.micro_batches)
        self.micro_batch = S * batch_size // M

        def plan() -> Tuple[List[Tuple[int, int]], str]:    # measured on rank 0, the same choice everywhere
            on_cpu = all(p.device.type == "cpu" for p in model.parameters())
            cores = usable_cores() * (W // max(1, pg.local_world_size)) if on_cpu else 0
            return plan_pipeline(cfg, self.layers, self.micro_batch, num_dense, pooled_width, bandwidth_gbps,
                                 cores, torch.get_num_threads(), max(1, W // int(cfg.stages)))
        split, self.schedule_name = on_rank0(plan, pg)       # an error there raised on every rank
        self.split = [tuple(x) for x in split]
        if self.schedule_name == "chimera" and (S % 2 or M % 2 or int(cfg.virtual_stages) != 1):
            raise ConfigError("parallel.pipeline.schedule: chimera needs an even number of stages and micro-batches "
                              "and virtual_stages 1")
        self.mesh = PipelineMesh(W, S, int(cfg.virtual_stages), bidirectional=self.schedule_name == "chimera")
        self.groups = PipelineGroups.build(self.mesh, timeout=pg.timeout)
        self.position = self.groups.position
        self.chunks = split_stages(self.layers, self.split)
        self.meter = BusyMeter()
        loss = ReplicaLoss(S * batch_size)
        if self.schedule_name == "chimera":
            self.runner: Any = ChimeraPipeline(self.chunks, self.groups, M, loss, self.meter)
        elif self.schedule_name in ASYNC_SCHEDULES:
            self.runner = AsyncPipeline(self.schedule_name, self.chunks, self.groups, M, loss, self.meter,
                                        max_versions=cfg.max_versions)
        else:
            self.runner = TorchPipeline(self.schedule_name, self.chunks, self.groups, M, loss, self.meter)
        self.router = SampleRouter(self.groups)
        self.mine = [k for _, k in self.mesh.chunks_on(self.position)]
        self.sync_chunks = sorted(set(self.mine))         # a sync group's members hold the same chunks
        self._names = {id(p): n for n, p in model.named_parameters()}
        weights = getattr(model, "position_weights", None)
        self.shared: List[nn.Parameter] = list(weights.parameters()) if weights is not None else []
        """Parameters every rank trains (the lookup's position weights; module doc)."""
        if self.shared and self.updates_inside:
            raise ConfigError("model.position_weights: not with parallel.pipeline.schedule: pipedream_async (it "
                              "updates each stage inside the schedule, before the embeddings' backward)")

    # ------------------------------------------------------------------ parameters
    def parameters(self) -> List[nn.Parameter]:
        """This rank's trained parameters: those of its chunks, then :attr:`shared`."""
        return self._chunk_parameters() + self.shared

    def _chunk_parameters(self) -> List[nn.Parameter]:
        seen, out = set(), []
        for k in self.sync_chunks:
            for p in self.chunks[k].parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def named_parameters(self) -> Dict[str, nn.Parameter]:
        """This rank's trained parameters under their names in ``model``."""
        return {self._names[id(p)]: p for p in self.parameters()}

    @property
    def updates_inside(self) -> bool:
        """True when the schedule applies the dense optimizer itself (pipedream_async, after every
        micro-batch's backward): :meth:`step` then needs the optimizer and the caller must not step it."""
        return isinstance(self.runner, AsyncPipeline) and self.runner.updates_inside

    @property
    def version_log(self) -> List[Dict[str, int]]:
        """Asynchronous schedules: per micro-batch and step, the weight version this rank's stage
        ran its forward and its backward on, the version sequential training would have used and
        the staleness (their difference); empty for the synchronous schedules."""
        return self.runner.version_log() if isinstance(self.runner, AsyncPipeline) else []

    # ------------------------------------------------------------------ one step
    def step(self, dense: torch.Tensor, pooled: torch.Tensor, labels: torch.Tensor, timers=_null_timer,
             optimizer=None) -> torch.Tensor:
        """Forward and backward of the global batch (this rank's ``dense (B, n)``, ``pooled (B, F D)``
        with its graph to the sharded embeddings, ``labels (B,)``): gradients in every chunk
        parameter's ``.grad`` (synchronised), the embeddings updated by their fused optimizers.
        pipedream_async (:attr:`updates_inside`) instead applies ``optimizer`` to this rank's chunk
        inside the schedule, once per micro-batch, and leaves no gradient.
        Returns the global batch's mean loss (on every rank)."""
        for p in self.parameters():
            p.grad = None
        with timers("pipeline_route"):
            routed = self.router.send(dense, pooled, labels)
        with timers("pipeline"):
            if isinstance(self.runner, AsyncPipeline):
                local_loss = self.runner.run(routed, self.micro_batch, self.num_dense, self.pooled_width, optimizer)
            elif isinstance(self.runner, ChimeraPipeline):
                local_loss = self.runner.run(routed, self.micro_batch, self.num_dense, self.pooled_width)
            else:
                local_loss = self.runner.run(routed)
        with timers("pipeline_route"):
            grad = self.router.grads(routed, pooled)                   # (B, F D): d(replica mean)/d(pooled)
        with timers("backward"):
            pooled.backward(grad * self.mesh.stages)                   # the collection expects d(rank mean)
        if not self.updates_inside:                                    # pipedream_async synced each update
            with timers("pipeline_sync"):
                self._sync_grads()
        with timers("pipeline_loss"):
            loss = local_loss.reshape(1).clone()
            if self.mesh.world_size > 1:
                dist.all_reduce(loss)                                  # sum over the replicas' last chunks
        return (loss / self.mesh.replicas).reshape(())

    def _sync_grads(self) -> None:
        """Sum each chunk's gradients over its copies (``mesh.sync_groups``), divide by R; average
        :attr:`shared`'s over all W ranks (each rank's holds its shards' ids, as under DDP)."""
        for params, group, n in ((self._chunk_parameters(), self.groups.sync, self.mesh.replicas),
                                 (self.shared, dist.group.WORLD if self.mesh.world_size > 1 else None,
                                  self.mesh.world_size)):
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            if group is not None and params:
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=group)
                flat.div_(n)
                grads = list(torch.split(flat, [p.numel() for p in params]))
            for p, g in zip(params, grads):
                p.grad = g.view_as(p)

    def train_step(self, dense: torch.Tensor, dist_batch, labels: torch.Tensor, optimizer, timers) -> torch.Tensor:
        """The trainer's step (``Trainer._train_step``): lookup, pipelined dense, optimizer."""
        emb = self.model.embedding
        with timers("lookup"):
            local = emb.compute(dist_batch)                            # (W B, local columns)
        with timers("output_dist"):
            pooled = emb.output_dist(local, dist_batch).wait()         # (B, F D)
        loss = self.step(dense, pooled, labels, timers, optimizer=optimizer)
        if not self.updates_inside:
            with timers("optimizer"):
                optimizer.step()
        return loss

    # ------------------------------------------------------------------ whole model on every rank
    @torch.no_grad()
    def sync_weights(self) -> None:
        """Copy every chunk's weights from the position that trains it to the replica's other
        ranks (collective over each replica), so each rank holds the whole trained dense model."""
        if self.mesh.stages == 1:
            return
        for k, chunk in enumerate(self.chunks):
            params = list(chunk.parameters())
            if not params:
                continue
            flat = torch.cat([p.reshape(-1) for p in params])
            src = self.groups.global_rank(self.mesh.chunk_position(DOWN, k))
            dist.broadcast(flat, src=src, group=self.groups.replica)
            for p, v in zip(params, torch.split(flat, [p.numel() for p in params])):
                p.copy_(v.view_as(p))
