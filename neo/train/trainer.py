"""The trainer: a config in, a trained model, metrics and checkpoints out.

Launch::

    neo train configs/train_tiny.yaml                                     # one process
    neo train configs/train_tiny.yaml train.steps=200 optim.lr=0.01       # dotted overrides
    torchrun --standalone --nproc-per-node 2 -m neo.train configs/main_job.yaml   # one node, 2 ranks
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m neo.train CONFIG   # 2 nodes

:class:`Trainer` builds the job (:mod:`neo.train.build`), then :meth:`Trainer.fit` runs the
pipelined (or plain) loop with evaluation and checkpoints at their cadence and returns the final
metrics (``fit(hook=...)``: a :class:`FitHook` may add evaluation points and stop the run after
one, as the MLPerf harness does, neo/mlperf/; a signal of ``train.stop_signals`` stops it after a
step the ranks agree on, with that step's checkpoint, neo/train/stop.py). Loss = BCE-with-logits, mean over the rank's
batch; DDP averages dense gradients and the sharded collection divides embedding gradients by W,
so W ranks of B samples train like one process on the global batch of W x B (see
neo/distributed/sharded_embedding.py).

Every rank takes the same number of steps: the loaders drop the last partial batch and an
epoch is ``(N // W) // B`` steps on every rank (rank shards may differ by one sample).
"""

from __future__ import annotations

import math
import os
import time
from contextlib import closing
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from neo.config.embedding import CachePolicy, ConfigError
from neo.train.build import build_job, probe_directory, restart_attempt, validate_training_config
from neo.train.cache_log import CacheMonitor
from neo.distributed.comms import CollectiveError, is_comm_error
from neo.distributed.heartbeat import Heartbeat
from neo.train.checkpoint import CheckpointError, CheckpointLease
from neo.train.epochs import epoch_batches
from neo.train.evaluation import Evaluator
from neo.train.pipeline import PlainLoop, StepBatch, TrainPipeline
from neo.train.run_log import RunLog, start_run_log
from neo.train.schedule import LRSchedule
from neo.train.step import DenseStep, Timers, wrap_ddp
from neo.train.step_stats import StepStats
from neo.train.stop import StopSignals, agreed_signal
from neo.train.trace import TraceRecorder, attach, write_trace
from neo.train.trainer_checkpointing import TrainerCheckpointing
from neo.train.trainer_report import TrainerReport

__all__ = ["FitHook", "Trainer", "TrainingDiverged", "dense_optimizer"]


_PHASES_OUTSIDE_STEPS = {"metrics", "evaluate", "checkpoint", "state_digest"}
"""Timed for errors, left out of ``phase_ms_per_step``."""


def dense_optimizer(cfg, params) -> torch.optim.Optimizer:
    """torch.optim optimizer of the ``optim`` section.

    torch's fused (single-kernel) implementation where it has one for the parameters' device
    (Adagrad: CPU only; SGD and Adam: CPU and CUDA): about 2.5x faster than the per-tensor
    loop on DLRM's dense parameters on one CPU thread, same update.

    No parameters (a pipeline rank whose chunks hold only parameterless layers, such as a stage
    of the interaction alone): one empty parameter group, whose ``step`` does nothing, instead of
    torch's "empty parameter list" error."""
    params = list(params)
    fused_devices = {"cpu"} if cfg.type == "adagrad" else {"cpu", "cuda"}
    fused = {p.device.type for p in params} <= fused_devices or None       # None: torch's default
    if not params:
        params = [{"params": []}]
    if cfg.type == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=fused)
    if cfg.type == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay,
                                   initial_accumulator_value=cfg.initial_accumulator_value, fused=fused)
    return torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                            fused=fused)


class TrainingDiverged(RuntimeError):
    """The training loss stopped being finite: the weights and optimizer state are NaN or
    infinite from there on, so :meth:`Trainer.fit` stops instead of training on."""


class FitHook:
    """Optional observer of :meth:`Trainer.fit`; this base class changes nothing.

    After every step ``after_step(step)`` may ask for an evaluation (every rank must answer the
    same). The trainer then completes the in-flight input distribution and calls
    ``evaluate(step, run_eval)``, where ``run_eval()`` is :meth:`Trainer.evaluate` (collective);
    it returns the metrics and whether to stop training now. A stopped run skips the final
    evaluation (its metrics are that evaluation's) and finishes as at ``total_steps``."""

    def after_step(self, step: int) -> bool:
        return False

    def evaluate(self, step: int, run_eval: Callable[[], Dict[str, Any]]) -> Tuple[Dict[str, Any], bool]:
        return run_eval(), False


class Trainer(TrainerCheckpointing, TrainerReport):
    """Builds the job of a validated :class:`neo.config.NeoConfig` (see module doc).

    Args:
        cfg: the config (sections tables, topology, model, data, optim, sharding, train, and the
            optional mlperf, parallel and async_train).
        pg: process groups (default: from torchrun's environment, or one local rank).
        log: where the plan report and notices go (rank 0).
    """

    def __init__(self, cfg, pg=None, log=print):
        from neo.distributed import ShardedEmbeddingCollection
        from neo.embedding import PositionWeights
        from neo.models import DLRM

        validate_training_config(cfg)
        if cfg.async_train.mode != "bsp":                      # WSP has a trainer of its own
            raise ConfigError("async_train.mode: wsp trains with neo.async_train.WSPTrainer "
                              "(neo train CONFIG, or torchrun ... -m neo.train CONFIG, dispatch to it)")
        self.cfg, t = cfg, cfg.train
        job = build_job(cfg, pg, log, warm_up=True)   # the first window is read while the plan is made
        self.pg, self.device, self.say, self.tables = job.pg, job.device, job.say, job.tables
        self.rank, self.W = self.pg.rank, self.pg.world_size
        self.data, self.mapping = job.data, job.mapping
        self.train_loader, self.val_loader = job.train_loader, job.val_loader
        self.B, self.steps_per_epoch, self.total_steps = job.batch_size, job.steps_per_epoch, job.total_steps
        self.plan, self.plan_report = job.plan, job.plan_report
        self.say(self.plan_report)
        torch.manual_seed(t.seed)
        store_dir = t.cache_store_dir or os.path.join(t.run_dir, "embedding_store")
        self.sharded = ShardedEmbeddingCollection(self.tables, self.plan, self.pg, backend=t.embedding_backend,
                                                  seed=t.seed, device=self.device, store_dir=store_dir,
                                                  fuse_output_dists=cfg.sharding.fuse_output_dists)
        cached = [tb for tb in self.tables if tb.cached]
        self.cache_monitor = CacheMonitor(self.sharded, [tb.name for tb in cached],
                                          self.pg.world if self.W > 1 else None)
        # cached tables: batch i+1's ids on their shards' ranks under step i (and the lookahead window)
        self.ahead = 1 + max((tb.cache_lookahead for tb in cached if tb.cache_policy is CachePolicy.LOOKAHEAD),
                             default=0) if cached else 0
        feats = [f for tb in self.tables for f in tb.feature_names]
        m = cfg.model
        position = PositionWeights(dict(m.position_weights)) if m.position_weights else None
        self.model = DLRM(self.sharded, len(feats), self.tables[0].dim, self.data.num_dense, list(m.dense_arch),
                          list(m.over_arch), m.interaction, m.dcn_layers, m.dcn_rank,
                          position_weights=position).to(self.device)   # the collection's weight_table
        self.timers = Timers()
        self.sharded.timers = self.timers                     # the backward's collectives and fused update
        if self.sharded.lookup is not None:
            self.sharded.lookup.timers = self.timers
        self.step_stats = StepStats()
        self.heartbeat = Heartbeat(None, self.rank, self.W, phase=lambda: self.timers.current)
        self.step_module = DenseStep(self.model, self.timers, overlap=t.pipelined,
                                     dense_dtype=torch.bfloat16 if t.dense_dtype == "bf16" else torch.float32)
        self.pipeline = None                                   # parallel.pipeline: neo/pipeline/trainer.py
        if cfg.parallel.pipeline.enabled:
            from neo.pipeline.trainer import pipelined_dense
            self.pipeline = pipelined_dense(cfg, self.model, self.pg, self.data.num_dense, log=self.say)
        self.ddp = wrap_ddp(self.step_module, self.pg) if self.pipeline is None else None
        self.evaluator = Evaluator(self.val_loader, t, self.mapping, self.sharded, self.step_module, self.model,
                                   self.pipeline, self.pg, self.data.num_dense, self.device)
        self.trace = TraceRecorder(self.rank, t.trace_steps) if t.trace else None    # train.trace: the timeline
        if self.trace is not None:
            attach(self.trace, self.timers, [self.train_loader, self.val_loader], self.sharded, self.ddp)
        dense_params = [p for n, p in self.model.named_parameters() if not n.startswith("embedding.")] \
            if self.pipeline is None else self.pipeline.parameters()
        self.optimizer = dense_optimizer(cfg.optim, dense_params)
        o = cfg.optim
        self.schedule = LRSchedule(o.lr, o.warmup_steps, o.decay_start, o.decay_steps, o.decay_power, o.end_ratio)
        self.step = 0
        self.losses: List[float] = []
        """Local loss of every step run by this trainer (tests compare them)."""
        self.attempt = restart_attempt()
        """torchrun's restart count: > 0 when this process replaces workers that failed."""
        self.resumed_from = None
        """The checkpoint this run resumed from (None: it started from step 0)."""
        self.checkpointer = None
        self.lease: Optional[CheckpointLease] = None
        """Rank 0's lease on ``train.checkpoint_dir`` (see neo/train/checkpoint/lease.py)."""
        self._lease_held = False                 # every rank: whether the run holds it (fit takes it again)
        self._saved_step: Optional[int] = None   # the step of the last save() (a stop saves its step once)
        if t.checkpoint_dir:
            probe_directory(t.checkpoint_dir, "train.checkpoint_dir")   # a save must not fail after the training
            self._take_lease()                  # before reading or clearing anything in the directory
            try:
                self._open_checkpoints(cached)
            except BaseException:
                self.release_checkpoint_dir()
                raise

    # ------------------------------------------------------------------ one step
    def _set_lr(self, step: int) -> None:
        lr = self.schedule(step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        factor = self.schedule.factor(step)                 # the tables follow the schedule's shape
        lookup = self.sharded.lookup
        if lookup is not None:
            lookup.set_learning_rates({tb.name: tb.optimizer.lr * factor for tb in lookup.tables})

    def _train_step(self, sb: StepBatch, dist_batch) -> torch.Tensor:
        b = sb.batch
        self._set_lr(self.step)
        if self.pipeline is not None:                                  # pipelined dense towers
            return self.pipeline.train_step(b.dense, dist_batch, b.labels, self.optimizer, self.timers)
        logits = self.ddp(b.dense, dist_batch)                         # (B,)
        with self.timers("dense_fwd"):
            loss = F.binary_cross_entropy_with_logits(logits, b.labels)
        with self.timers("backward"):                                  # dense grads + DDP AllReduce +
            self.optimizer.zero_grad(set_to_none=True)                 # embedding grads + fused sparse update
            loss.backward()
        with self.timers("optimizer"):
            self.optimizer.step()
        return loss.detach()

    def _batches(self) -> Iterator[StepBatch]:
        """Exactly ``total_steps - step`` batches, ``steps_per_epoch`` per epoch on every rank
        (neo/train/epochs.py), each with its loader's state after it (what a checkpoint of its
        step saves)."""
        loader = self.train_loader
        with closing(epoch_batches(loader, self.step, self.total_steps, self.steps_per_epoch, self.B,
                                   self.mapping)) as batches:
            for batch in batches:
                yield StepBatch(batch, loader.state_dict())

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> Dict[str, Any]:
        """Exact AUC, log loss, accuracy over the validation set (every rank's samples; collective;
        see neo/train/evaluation.py)."""
        return self.evaluator()

    # ------------------------------------------------------------------ the loop
    def fit(self, hook: Optional[FitHook] = None) -> Dict[str, Any]:
        """Train to ``total_steps`` (or until ``hook`` stops it); evaluate and checkpoint at their
        cadence (and the hook's evaluation points) and at the end.

        A collective that fails or times out (another rank died, stopped or went elsewhere)
        raises :class:`neo.distributed.comms.CollectiveError` naming the step, the operation
        and, from the heartbeats, the ranks at fault."""
        if self.cfg.train.checkpoint_dir and not self._lease_held:
            self._take_lease()                          # released by an earlier fit()
        try:
            with StopSignals(self.cfg.train.stop_signals) as stop:
                return self._fit(hook or FitHook(), stop)
        except Exception as e:  # noqa: BLE001 - re-raised, named when it is a communication failure
            if isinstance(e, CheckpointError) or not (isinstance(e, CollectiveError) or is_comm_error(e)):
                raise
            raise self._named_failure(e) from e
        finally:
            runlog = self.__dict__.pop("_runlog", None)
            if runlog is not None:
                runlog.close()
            self.heartbeat.close()
            self.release_checkpoint_dir()

    def _fit(self, hook: FitHook, stop: StopSignals) -> Dict[str, Any]:
        t = self.cfg.train
        restarted = self.resumed_from is not None or self.attempt > 0
        # a fresh run (step 0) moves an earlier run's log aside; a restart, a resume, or a second
        # fit() of this trainer goes on in it
        runlog = RunLog(t.run_dir, self.rank, self.total_steps, self.step, progress=t.progress,
                        rewind_to=self.step if restarted or self.step > 0 else None)
        self._runlog = runlog                  # closed by fit() on every way out (an error too)
        if restarted:       # records of the steps being redone were dropped: say where the run went on from
            runlog.record("restart", self.step, {"from_step": self.step, "attempt": self.attempt,
                                                 "checkpoint": self.resumed_from,
                                                 "dropped_records": runlog.dropped_records})
        start_run_log(runlog, self.plan, self.device, self.step)
        if t.pipelined:
            loop = TrainPipeline(self._batches(), self.sharded, self._train_step, self.device, self.timers,
                                 ahead=self.ahead, prefetch=self.sharded.prefetch if self.ahead else None)
        else:
            loop = PlainLoop(self._batches(), self.sharded, self._train_step, self.device, self.timers)
        self._last_loader_state = self.train_loader.state_dict()
        start_step, window_loss, window_n = self.step, 0.0, 0
        train_s, eval_s, t0 = 0.0, 0.0, time.perf_counter()
        last_eval: Dict[str, Any] = {}
        last_eval_step, hook_stop, stopped = -1, False, None
        self.timers.reset()
        while self.step < self.total_steps:
            self.heartbeat.step = self.step
            if self.trace is not None:
                self.trace.begin_step(self.step)
            before, t_step = dict(self.timers.seconds), time.perf_counter()
            out = loop.step()
            if out is None:
                break
            if self.checkpointer is not None:
                self.checkpointer.poll()                           # a failed background save stops the run
            self.step_stats.record(time.perf_counter() - t_step, before, self.timers.seconds)
            loss, sb = out
            self.step += 1
            self._last_loader_state = sb.loader_state
            value = float(loss)
            self.losses.append(value)
            window_loss += value
            window_n += 1
            runlog.advance(1, loss=value)
            pause = time.perf_counter()
            if self.step % t.log_every == 0 or self.step == self.total_steps:
                avg = torch.tensor([window_loss, float(window_n)], dtype=torch.float64)
                if self.W > 1:
                    with self.timers("metrics"):
                        dist.all_reduce(avg, group=self.pg.world)
                elapsed = train_s + (pause - t0)
                if not math.isfinite(float(avg[0])):   # the same value on every rank: all stop together
                    raise TrainingDiverged(
                        f"the training loss is {float(avg[0] / avg[1])} over steps {self.step - window_n + 1}.."
                        f"{self.step}: the model diverged (weights and optimizer state are no longer finite); "
                        f"lower optim.lr and the tables' optimizer lr, or add warmup (optim.warmup_steps)")
                runlog.record("train", self.step, {
                    "loss": float(avg[0] / avg[1]), "lr": self.schedule(self.step - 1),
                    "samples_per_s": (self.step - start_step) * self.B * self.W / max(elapsed, 1e-9)})
                if self.cache_monitor.active:
                    runlog.record("cache", self.step, self.cache_monitor.window())
                window_loss, window_n = 0.0, 0
            eval_now = t.eval_every and self.step % t.eval_every == 0 and self.step < self.total_steps
            hook_eval = hook.after_step(self.step)
            ckpt_now = t.checkpoint_dir and t.checkpoint_every and self.step % t.checkpoint_every == 0 \
                and self.step < self.total_steps
            if eval_now or hook_eval or ckpt_now:
                loop.drain()   # training work (the next batch's input distribution in flight): timed as training
                pause = time.perf_counter()
                train_s += pause - t0
                if eval_now or hook_eval:
                    with self.timers("evaluate"):
                        if hook_eval:
                            last_eval, hook_stop = hook.evaluate(self.step, self.evaluate)
                        else:
                            last_eval = self.evaluate()
                    last_eval_step = self.step
                    runlog.record("eval", self.step, last_eval)
                    runlog.message(f"step {self.step}: auc {last_eval.get('auc', float('nan')):.4f} "
                                   f"logloss {last_eval.get('logloss', float('nan')):.4f} "
                                   f"ne {last_eval.get('ne', float('nan')):.4f}")
                if ckpt_now:
                    with self.timers("checkpoint"):
                        self.save()
                t0 = time.perf_counter()
                eval_s += t0 - pause
                if hook_stop:
                    break
            if stop.names and self.step < self.total_steps and (self.W == 1 or self.step % t.log_every == 0):
                # a stop signal (train.stop_signals): every rank stops after this step
                stopped = agreed_signal(stop.received, self.pg.world if self.W > 1 else None)
                if stopped is not None:
                    train_s += time.perf_counter() - t0
                    loop.drain()
                    t0 = time.perf_counter()
                    break
        train_s += time.perf_counter() - t0
        if self.trace is not None:
            self.trace.end_step()
        steps_run = self.step - start_step
        if stopped is not None:
            return self._stopped(stopped, runlog, steps_run, train_s)
        with self.timers("evaluate"):
            if (steps_run or not last_eval) and last_eval_step != self.step:
                last_eval = self.evaluate()
        with self.timers("checkpoint"):
            if t.checkpoint_dir and steps_run:
                self.save()
            if self.checkpointer is not None:
                self.checkpointer.wait()                             # the last checkpoint is committed
            if self.cache_monitor.active:           # the end of training writes every dirty row back,
                self.sharded.flush_cache()          # counted in the last cache window (a save did it before)
        phases = {k: round(1e3 * v / max(steps_run, 1), 3) for k, v in self.timers.snapshot().items()
                  if k not in _PHASES_OUTSIDE_STEPS}
        final = dict(self._run_figures(steps_run, train_s),
                     auc=last_eval.get("auc"), logloss=last_eval.get("logloss"), ne=last_eval.get("ne"),
                     calibration=last_eval.get("calibration"), accuracy=last_eval.get("accuracy"),
                     eval_samples=last_eval.get("count"), best_auc=self.data.best_auc, phase_ms_per_step=phases)
        if self.cache_monitor.active:
            totals = self.cache_monitor.totals()
            tail = self.cache_monitor.window(totals)           # after the last window: evaluation, write-back
            if any(v for counts in tail.values() for k, v in counts.items() if k in ("batches", "writebacks")):
                runlog.record("cache", self.step, tail)
            final["cache"] = self.cache_monitor.summary(totals)
        final.update(self._predicted_vs_measured())
        if t.state_digest:
            with self.timers("state_digest"):
                final["state_sha256"] = self.state_sha256()
        if self.trace is not None:                                   # rank 0 writes every rank's spans
            final["trace"] = write_trace(self.trace, t.trace, self.rank, self.W, self.pg.world)
        runlog.record("final", self.step, final)
        runlog.close()
        return final
