"""Wave synchronous parallel (WSP) training: virtual workers under bounded staleness.

HetPipe (Park et al., ATC 2020, section 5) trains virtual workers (VWs) data-parallel through a
parameter server: each VW runs a *wave* of local steps on the weights it has, pushes the wave's
accumulated update at the wave's end, and may run at most ``staleness`` waves ahead of the
slowest VW. Neo's form, for DLRM (``async_train.mode: wsp``; launch as ``neo train``'s)::

    torchrun --standalone --nproc-per-node 4 -m neo.async_train CONFIG async_train.mode=wsp \
        async_train.staleness=2 async_train.wave_steps=4

Design (the simplest that is correct; docs/async.md):

- **Every worker holds the whole model**: the dense model and every embedding table (one
  TableBatchedEmbedding, all tables in memory; cached tables are refused). It starts from
  exactly the state the synchronous trainer starts from (the planner's plan, its sharded
  initialization, gathered once).
- **A wave** is ``wave_steps`` local steps on the worker's own data shard. The state does not
  change inside a wave: the dense gradients accumulate in ``.grad``, the embedding lookups run
  without autograd and the gradient of each step's pooled embeddings ``(B, F * D)`` is kept
  with its ids.
- **The parameter server** (rank 0, a thread: :mod:`neo.async_train.server`) aggregates wave c
  once every worker has pushed it and logs it as version c + 1. Every worker **applies** every
  version, in order, to its replica: the dense optimizer on the averaged gradient and the fused
  sparse optimizers on all workers' ids with their pooled gradients (the update a data-parallel
  table applies for the global batch). Same inputs, same order: the replicas and their
  optimizer states stay identical, and no table ever travels.
- **Position weights** (``model.position_weights``) are dense parameters: a worker's lookup
  weighs its ids with them (tables frozen, so that the lookup's backward gives the weights their
  gradient and leaves the tables as they are), their gradient accumulates with the others, and
  the ids travel with the weights used, which the tables' update applies.
- **Clocks** (:class:`~neo.async_train.server.WaveClock`, c10d store keys): before its wave c a
  worker waits until version >= c - staleness, pulls and applies every version there is, and
  computes wave c on version v: its staleness is c - v <= ``staleness``.

``staleness: 0`` is synchronous training with gradients accumulated over ``wave_steps`` steps;
with ``wave_steps: 1`` it is, bit for bit at 2 ranks, what :class:`neo.train.trainer.Trainer`
computes (tests/async_train/test_wsp.py): DDP's averaged dense gradient and the sharded
collection's 1/W embedding gradient scale, the same optimizers, the same learning-rate schedule
(version c trains at ``schedule(c * wave_steps)``).

A virtual worker of several ranks runs its waves in lock-step (a barrier of its ranks at each
wave); each rank still pushes its own gradients. ``async_train.slowdown`` (or ``emulate_speeds``)
stretches a rank's steps by a sleep, to emulate slower devices on one host. Evaluation runs once,
at the end, on the final state (every version applied). Checkpoints (``train.checkpoint_dir``,
every ``train.checkpoint_every`` steps, a multiple of ``wave_steps``): rank 0 writes its replica
at a version, every rank resumes from it (:mod:`neo.async_train.checkpoint`). ``replay`` (a
run directory of an earlier WSP run of the same config) computes every wave on the version that
run's wave did, reproducing its training bit for bit (:mod:`neo.async_train.replay`).
"""

from __future__ import annotations

import datetime
import math
import random
import sys
import time
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from neo.async_train.checkpoint import WSPCheckpoints
from neo.async_train.replay import check_replay, check_replay_source, replay_versions
from neo.async_train.wsp_checkpointing import WSPCheckpointing
from neo.async_train.wsp_report import WSPReport
from neo.async_train.server import ParameterServer, RemoteLink, ServerLink, WaveClock, WaveStop, make_stores
from neo.config.embedding import ConfigError
from neo.distributed.comms import CollectiveError, is_comm_error
from neo.distributed.heartbeat import Heartbeat
from neo.train.build import build_job, validate_training_config
from neo.train.epochs import epoch_batches, seek
from neo.train.run_log import RunLog, start_run_log
from neo.train.checkpoint import CheckpointError, CheckpointLease
from neo.train.schedule import LRSchedule
from neo.train.step import Timers
from neo.train.stop import StopSignals, signal_name
from neo.train.trace import TraceRecorder, attach, write_trace

__all__ = ["WSPTrainer", "check_wsp_config", "run", "main"]


_STOP_WITH_GROUPS = ("train.stop_signals: {}: stopping on a signal is not supported with virtual workers of several "
                     "ranks (async_train.virtual_workers / num_virtual_workers) yet; leave one of the two empty")


def check_wsp_config(cfg) -> None:
    """What WSP does not support yet, as ConfigErrors naming the field."""
    t, a = cfg.train, cfg.async_train
    if t.checkpoint_every % a.wave_steps:
        raise ConfigError(f"train.checkpoint_every: {t.checkpoint_every}: under async_train.mode: wsp a checkpoint is "
                          f"a version, taken at a wave's end: a multiple of async_train.wave_steps ({a.wave_steps})")
    if t.eval_every:
        raise ConfigError("train.eval_every: under async_train.mode: wsp the workers are at different waves; "
                          "only the end is evaluated (set it to 0)")
    if cfg.parallel.pipeline.enabled:
        raise ConfigError("parallel.pipeline: pipelined dense towers are not supported under async_train.mode: wsp")
    if t.stop_signals and any(len(g) > 1 for g in a.virtual_workers):
        raise ConfigError(_STOP_WITH_GROUPS.format(t.stop_signals))


class WSPTrainer(WSPCheckpointing, WSPReport):
    """Trains a validated config under WSP (module docstring). ``fit()`` returns the final metrics
    (rank 0's, with every worker's clocks in the run log). ``replay``: the run directory (or
    ``metrics.jsonl``) of an earlier run of this config whose schedule to follow
    (:mod:`neo.async_train.replay`); None: the config's ``async_train.replay``, where set."""

    def __init__(self, cfg, pg=None, log=print, replay: Optional[str] = None):
        from neo.distributed import ShardedEmbeddingCollection
        from neo.embedding import PositionWeights, TableBatchedEmbedding
        from neo.models import DLRM
        from neo.train.trainer import dense_optimizer

        validate_training_config(cfg)
        check_wsp_config(cfg)
        self.cfg, t, a = cfg, cfg.train, cfg.async_train
        replay = replay if replay is not None else (a.replay or None)
        if replay is not None:     # a config error: before the data and the plan are built
            check_replay_source(replay, t.run_dir)
        job = build_job(cfg, pg, log)
        self.pg, self.device, self.say, tables = job.pg, job.device, job.say, job.tables
        self.rank, self.W = self.pg.rank, self.pg.world_size
        self.data, self.mapping = job.data, job.mapping
        self.train_loader, self.val_loader = job.train_loader, job.val_loader
        self.B, self.steps_per_epoch, self.total_steps = job.batch_size, job.steps_per_epoch, job.total_steps
        self.plan, report = job.plan, job.plan_report
        cached = [k for k, tb in enumerate(tables) if tb.cached]
        if cached:
            raise ConfigError(f"tables[{cached[0]}].placement: cached tables are not supported under "
                              "async_train.mode: wsp (every worker holds every table in memory)")

        torch.manual_seed(t.seed)                      # the synchronous trainer's initial state, exactly
        init = ShardedEmbeddingCollection(tables, self.plan, self.pg, backend=t.embedding_backend, seed=t.seed,
                                          device=self.device)
        full = init.full_weights()
        del init
        self.embedding = TableBatchedEmbedding(tables, backend=t.embedding_backend, device=self.device, seed=t.seed)
        with torch.no_grad():
            for name, w in full.items():
                self.embedding.table_weight(name).copy_(w)
        feats = [f for tb in tables for f in tb.feature_names]
        m = cfg.model
        position = PositionWeights(dict(m.position_weights)) if m.position_weights else None
        self.model = DLRM(self.embedding, len(feats), tables[0].dim, self.data.num_dense, list(m.dense_arch),
                          list(m.over_arch), m.interaction, m.dcn_layers, m.dcn_rank,
                          position_weights=position).to(self.device)
        self.params = [p for n, p in self.model.named_parameters() if not n.startswith("embedding.")]
        self.optimizer = dense_optimizer(cfg.optim, self.params)
        o = cfg.optim
        self.schedule = LRSchedule(o.lr, o.warmup_steps, o.decay_start, o.decay_steps, o.decay_power, o.end_ratio)
        self.timers = Timers()
        self.embedding.timers = self.timers
        self.autocast = t.dense_dtype == "bf16"

        topo = cfg.topology.to_topology(self.W, self.pg.local_world_size)
        self.speeds = [d.speed for d in topo.devices]
        self.groups = a.worker_groups(self.W, self.speeds)
        if t.stop_signals and any(len(g) > 1 for g in self.groups):
            raise ConfigError(_STOP_WITH_GROUPS.format(t.stop_signals))
        self.slowdown = a.slowdown_of(self.rank, self.speeds, world_size=self.W)
        self.staleness, self.wave_steps = a.staleness, a.wave_steps
        self.waves = math.ceil(self.total_steps / self.wave_steps)
        self.ckpt: Optional[WSPCheckpoints] = None
        self.lease: Optional[CheckpointLease] = None
        self.start_version = 0
        """The version this run starts at (a resumed run: its checkpoint's)."""
        if t.checkpoint_dir:
            self._open_checkpoints()
        self.replay: Optional[List[int]] = None
        """The version each wave from start_version on computes on, where replaying a run's schedule."""
        if replay is not None:     # every worker's schedule checked on every rank: all fail alike, none hangs
            schedules = replay_versions(replay, self.W, self.waves, self.start_version)
            for r, versions in enumerate(schedules):
                check_replay(versions, self.start_version, self.staleness, r)
            self.replay = schedules[self.rank]
        self.say(report)
        self.say(f"neo wsp: {len(self.groups)} virtual workers {self.groups}, staleness {self.staleness}, "
                 f"{self.wave_steps} steps per wave, {self.waves} waves")
        self.trace = TraceRecorder(self.rank, t.trace_steps) if t.trace else None
        if self.trace is not None:
            attach(self.trace, self.timers, [self.train_loader, self.val_loader])

        timeout = datetime.timedelta(seconds=t.collective_timeout_s)
        self.ps_group = dist.new_group(backend="gloo") if self.W > 1 else None
        self.vw_group = None
        for g in self.groups:                          # every rank creates every group, in one order
            grp = dist.new_group(g, backend="gloo") if self.W > 1 else None
            if self.rank in g and len(g) > 1:
                self.vw_group = grp
        store, server_store = make_stores(self.rank, self.W, self.pg.world, timeout)
        self.clock = WaveClock(store, timeout, base=self.start_version)
        self.server = None
        if self.rank == 0:
            server_clock = WaveClock(server_store, timeout, base=self.start_version)
            server_clock.init()
            self.server = ParameterServer(self.W, server_clock, self.ps_group, self.trace)
            self.link = ServerLink(self.server)
        else:
            self.link = RemoteLink(self.ps_group)
        self.step = self.start_version * self.wave_steps
        self.version = self.start_version
        """Versions (aggregated waves) applied to this worker's replica."""
        # which worker stopped, when a wait for a version or a push times out (as neo train's)
        self.heartbeat = Heartbeat(None, self.rank, self.W, phase=lambda: f"version {self.version}")
        self.losses: List[float] = []
        self.waves_log: List[Dict[str, Any]] = []
        """Per wave this worker ran: when it started, the version it computed on, its staleness."""

    # ------------------------------------------------------------------ data
    def _batches(self, start: int) -> Iterator[Any]:
        """This rank's batches from step ``start`` on (a resumed run: where that step left its
        loader), ``steps_per_epoch`` per epoch (neo/train/epochs.py)."""
        loader = self.train_loader
        if start:
            seek(loader, start, self.steps_per_epoch, self.B)
        yield from epoch_batches(loader, start, self.total_steps, self.steps_per_epoch, self.B, self.mapping)

    # ------------------------------------------------------------------ versions
    def _set_lr(self, step: int) -> None:
        lr = self.schedule(step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        factor = self.schedule.factor(step)                 # the tables follow the schedule's shape
        self.embedding.set_learning_rates({tb.name: tb.optimizer.lr * factor for tb in self.embedding.tables})

    def apply(self, update: Dict[str, Any]) -> None:
        """Apply one aggregated wave (:func:`neo.async_train.server.aggregate`) to this replica."""
        from neo.sparse import KeyedJaggedBatch

        self._set_lr(update["wave"] * self.wave_steps)
        with torch.no_grad():
            for p, g in zip(self.params, torch.split(update["dense"], [p.numel() for p in self.params])):
                p.grad = g.view_as(p).clone()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        batch = KeyedJaggedBatch(update["keys"], update["values"], update["lengths"], update["batch_size"],
                                 weights=update["weights"])
        nothing = torch.zeros(len(batch.keys) * batch.batch_size, dtype=torch.bool, device=self.device)
        pooled = self.embedding(batch, pooled_bags=nothing)    # pools no bag; its backward updates from all
        pooled.backward(update["grads"])                          # the fused sparse optimizers, global batch
        version = update["wave"] + 1
        if self.rank == 0 and self.ckpt is not None and self.ckpt.due(version):
            self._save(version)

    def _catch_up(self, need: int, stop: Optional[StopSignals] = None, exact: bool = False) -> None:
        """Wait for ``need`` versions, then pull and apply every version there is (``exact``: up to
        version ``need`` alone). ``stop``: the wait ends in :class:`WaveStop` once a signal of
        train.stop_signals came, here or elsewhere."""
        asked = None if stop is None else (lambda: self._stop_signal(stop) is not None)
        with self.timers("wsp_wait"):
            self.clock.wait_version(need, asked)
        latest = need if exact else max(need, self.clock.version())
        if latest > self.version:
            with self.timers("wsp_pull"):
                updates = self.link.pull(self.version, latest)
            with self.timers("wsp_apply"):
                for u in updates:
                    self.apply(u)
            self.version = latest

    # ------------------------------------------------------------------ a wave
    def _local_step(self, batch, payload: Dict[str, Any]) -> float:
        s = batch.sparse
        position = self.model.position_weights
        if position is None:
            with self.timers("lookup"), torch.no_grad():
                pooled = self.embedding(s)                         # (B, F * D)
            pooled.requires_grad_(True)
        else:   # learnable per-id weights: the lookup, tables frozen, gives them their gradient (a dense one)
            with self.timers("lookup"):
                s = position(s)
                self.embedding.frozen = True
                try:
                    pooled = self.embedding(s)                     # (B, F * D), a graph to the weights only
                finally:
                    self.embedding.frozen = False
            pooled.retain_grad()
        with self.timers("dense_fwd"), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.model.head(batch.dense, pooled).float()  # (B,)
            loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        with self.timers("backward"):                              # dense grads accumulate over the wave
            loss.backward()
        weights = None if s.weights is None else s.weights.detach()   # the tables' update weighs its ids alike
        payload["batches"].append((s.values, s.lengths, weights, s.batch_size))
        payload["grads"].append(pooled.grad.float())               # (B, F * D)
        return float(loss.detach())

    def fit(self) -> Dict[str, Any]:
        """Train; a wait for a version, or a push or pull, that fails or times out (a worker died
        or stalled) raises :class:`~neo.distributed.comms.CollectiveError` naming, from the
        heartbeats, the worker at fault."""
        try:
            with StopSignals(self.cfg.train.stop_signals) as stop:
                return self._fit(stop)
        except Exception as e:  # noqa: BLE001 - re-raised, named when it is a communication failure
            if isinstance(e, (CheckpointError, ConfigError)) or not (
                    isinstance(e, (CollectiveError, dist.DistError)) or is_comm_error(e)):
                raise
            cause = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
            raise CollectiveError(
                f"rank {self.rank}: step {self.step + 1} (version {self.version}): a worker did not answer within "
                f"train.collective_timeout_s = {self.cfg.train.collective_timeout_s:g} s: "
                f"{self.heartbeat.diagnose()}. Cause: {cause}") from e
        finally:
            runlog = self.__dict__.pop("_runlog", None)
            if runlog is not None:
                runlog.close()
            self.heartbeat.close()
            self._release()

    # ------------------------------------------------------------------ stopping (train.stop_signals)
    def _stop_signal(self, stop: StopSignals) -> Optional[int]:
        """The signal the run stops for: this worker's (told to the others through the store), or
        one another worker received; None while none came."""
        if stop.received is not None:
            self.clock.request_stop(stop.received)
        return self.clock.stop_requested()

    def _stopped(self, num: int, pushed: int, runlog: RunLog, start: float) -> Dict[str, Any]:
        """Every worker stops at its next wave (this one after pushing ``pushed`` waves); the
        version all of them completed is v = the smallest clock; rank 0 applies every version up
        to v and writes its checkpoint (train.checkpoint_dir), which a resumed run starts from."""
        if self.trace is not None:
            self.trace.end_step()
        self.clock.set_stopped(self.rank, pushed)
        version, checkpoint = None, None
        if self.rank == 0:
            version = min(self.clock.stopped_clocks(self.W))
            self._catch_up(version)
            if self.ckpt is not None and version > self.start_version:
                if version not in self.ckpt.saved:
                    self._save(version)
                checkpoint = self.ckpt.path(version)
            elif self.ckpt is not None and self.start_version:
                checkpoint = self.ckpt.path(self.start_version)     # nothing new: where this run started
        self.link.done()
        if self.server is not None:
            self.server.join()
        t = self.cfg.train
        final = {"mode": "wsp", "stopped": signal_name(num), "exit_status": 128 + num, "checkpoint": checkpoint,
                 "version": version, "steps": None if version is None else version * self.wave_steps,
                 "world_size": self.W, "train_seconds": round(time.time() - start, 3)}
        if self.trace is not None:
            final["trace"] = write_trace(self.trace, t.trace, self.rank, self.W, self.pg.world if self.W > 1 else None)
        runlog.record("stopped", final["steps"] or 0, final)
        runlog.message(f"stopped by {final['stopped']} at version {version}: "
                       + (f"checkpoint {checkpoint}" if checkpoint else "no train.checkpoint_dir, nothing saved"))
        runlog.close()
        return final

    def _fit(self, stop: StopSignals) -> Dict[str, Any]:
        t = self.cfg.train
        from neo.train.build import restart_attempt

        # a torchrun restart before any checkpoint rewinds its log too (not moved aside as a fresh run's)
        resumed = self.start_version > 0 or restart_attempt() > 0
        runlog = RunLog(t.run_dir, self.rank, self.total_steps, self.step, progress=t.progress,
                        rewind_to=self.step if resumed else None)
        self._runlog = runlog                  # closed by fit() on every way out (an error too)
        start_run_log(runlog, self.plan, self.device, self.step)
        rng = random.Random(t.seed * 7919 + self.rank)
        slow = self.slowdown
        batches = self._batches(self.step)
        if self.W > 1:
            dist.barrier(group=self.pg.world)
        if self.server is not None:
            self.server.start()
        start = time.time()
        window, window_n = 0.0, 0
        stoppable = stop if t.stop_signals else None
        for c in range(self.start_version, self.waves):
            if self.vw_group is not None:
                dist.barrier(group=self.vw_group)                  # a virtual worker's ranks in lock-step
            try:
                if stoppable is not None and self._stop_signal(stop) is not None:
                    raise WaveStop()
                if self.replay is None:
                    self._catch_up(max(0, c - self.staleness), stoppable)
                else:                                          # the recorded run's version, no later one
                    self._catch_up(self.replay[c - self.start_version], stoppable, exact=True)
            except WaveStop:
                return self._stopped(self._stop_signal(stop), c, runlog, start)
            self.waves_log.append({"wave": c, "t": time.time(), "version": self.version,
                                   "staleness": c - self.version})
            n = min(self.wave_steps, self.total_steps - c * self.wave_steps)
            payload: Dict[str, Any] = {"keys": None, "steps": n, "batches": [], "grads": []}
            for _ in range(n):
                if self.trace is not None:
                    self.trace.begin_step(self.step)
                t0 = time.perf_counter()
                with self.timers("data"):
                    batch = next(batches)
                payload["keys"] = tuple(batch.sparse.keys)
                loss = self._local_step(batch, payload)
                if slow.factor > 1 and rng.random() < slow.probability:
                    with self.timers("slowdown"):
                        time.sleep((slow.factor - 1) * (time.perf_counter() - t0))
                self.step += 1
                self.heartbeat.step = self.step
                self.losses.append(loss)
                window, window_n = window + loss, window_n + 1
                runlog.advance(1, loss=loss)
                if self.step % t.log_every == 0 or self.step == self.total_steps:
                    runlog.record("train", self.step, {"loss": window / window_n, "lr": self.schedule(self.step - 1),
                                                       "wave": c, "version": self.version})
                    window, window_n = 0.0, 0
            with self.timers("wsp_push"):
                payload["dense"] = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                              for p in self.params]).float()
                self.link.push(c, payload)
            self.clock.set_clock(self.rank, c + 1)
            self.optimizer.zero_grad(set_to_none=True)
        if self.trace is not None:
            self.trace.end_step()
        self._catch_up(self.waves)                                 # every version: the replicas agree
        end = time.time()
        self.link.done()
        if self.server is not None:
            self.server.join()
        with self.timers("evaluate"):
            last_eval = self.evaluate()
        final = self._final(runlog, start, end, last_eval)
        if self.trace is not None:
            final["trace"] = write_trace(self.trace, t.trace, self.rank, self.W, self.pg.world if self.W > 1 else None)
        runlog.record("final", self.step, final)
        runlog.close()
        return final


def run(cfg, pg=None) -> int:
    """``neo train`` for ``async_train.mode: wsp``: train, print the final JSON line (rank 0)."""
    from neo.commands.train import input_errors, report_error, report_final, setup_errors

    try:
        trainer = WSPTrainer(cfg, pg=pg)
    except setup_errors() as e:      # the config asks for something this run cannot do: exit 2
        return report_error(e, pg, 2)
    from neo.train.checkpoint import CheckpointError

    try:
        final, rank = trainer.fit(), trainer.rank
    except input_errors() as e:       # a bad data row, or a cache too small, met as the run goes
        return report_error(e, pg, 2)
    except CheckpointError as e:      # a save that failed mid-run, a lost lease: one line, as neo train
        return report_error(e, pg, 1)
    del trainer                      # its process groups are freed by end_process_groups, not at exit
    status = final.get("exit_status", 0)           # 128 + N: a signal of train.stop_signals stopped it
    if rank == 0 and final.get("stopped"):
        where = f"checkpoint {final['checkpoint']}: the same command resumes there (train.resume)" \
            if final["checkpoint"] else "nothing saved (no train.checkpoint_dir)"
        print(f"neo wsp: stopped by {final['stopped']} at version {final['version']}; {where}",
              file=sys.stderr, flush=True)
    return report_final(final, rank, pg, status)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m neo.async_train CONFIG [key=value ...]`` (``async_train.mode=wsp`` is implied)."""
    from neo.config import load_config

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m neo.async_train CONFIG [key=value ...]", file=sys.stderr)
        return 2
    try:
        cfg = load_config(argv[0], ["async_train.mode=wsp", *argv[1:]])
        validate_training_config(cfg)
        check_wsp_config(cfg)
    except ConfigError as e:
        print(f"neo wsp: error: {e}", file=sys.stderr)
        return 2
    return run(cfg)
