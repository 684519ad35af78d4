"""``neo mlperf``: run the DLRM-DCNv2 benchmark once per seed, log it the MLPerf way, score it.

    neo mlperf configs/mlperf_dcnv2_tiny.yaml --results-dir runs/mlperf_tiny --seeds 3
    torchrun --standalone --nproc-per-node 2 -m neo.mlperf configs/mlperf_dcnv2_tiny.yaml --results-dir DIR
    torchrun --nnodes 1 --nproc-per-node 8 -m neo.mlperf configs/mlperf_dcnv2_gpu.yaml --results-dir DIR \\
        --division closed --seeds 10

One run per seed (``train.seed`` + i for run i), in this order, into ``DIR/result_<seed>.txt``:

1. ``cache_clear``, ``init_start``, the submission keys; the :class:`neo.train.trainer.Trainer` is
   built (data opened or generated, plan, model); the hyper-parameters it actually uses (read
   from its optimizer, schedule, tables and loaders); ``init_stop``;
2. every rank waits for the others, then ``run_start`` and the clock starts;
3. :meth:`Trainer.fit` with an :class:`neo.mlperf.hook.MLPerfHook`: evaluation every
   ``mlperf.eval_every_epochs`` over the whole validation set, stop at ``mlperf.target_auc``
   (``run_stop`` success) or at ``mlperf.max_epochs`` (``run_stop`` aborted).

What the harness changes in the config, for every run: ``train.seed``; ``train.eval_every`` 0
and ``train.eval_batches`` 0 (the hook evaluates, over every batch); ``train.steps`` 0 and
``train.epochs`` = ceil(max_epochs); ``train.checkpoint_dir`` null (a run starts from scratch,
never from another seed's checkpoint); ``train.state_digest`` false; ``train.run_dir``
``DIR/run_<seed>`` (the trainer's metrics and plan). Rank 0 writes the logs and
``DIR/summary.json`` (:mod:`neo.mlperf.summary`).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import sys
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from neo.config.embedding import ConfigError
from neo.distributed import end_process_groups
from neo.mlperf import rules
from neo.mlperf.hook import Cadence, MLPerfHook
from neo.mlperf.log import MLPerfLog
from neo.mlperf.summary import RunSummary, format_summary, summary_dict, write_summary

__all__ = ["run_benchmark", "check_request", "prepare_results_dir", "DIVISIONS"]

DIVISIONS = ("open", "closed")


def check_request(cfg, division: str, seeds: int) -> None:
    """What can be checked before any process group exists: division, seeds, the config's rules."""
    if division not in DIVISIONS:
        raise ConfigError(f"--division: {division!r} is not one of {list(DIVISIONS)}")
    if seeds < 1:
        raise ConfigError(f"--seeds: must be >= 1 (runs, one per seed), got {seeds}")
    if cfg.train.stop_signals:
        raise ConfigError(f"train.stop_signals: {cfg.train.stop_signals}: a timed MLPerf run stopped part way is no "
                          "result, and neo mlperf keeps no checkpoints to resume it from; leave it empty")
    if division == "closed":
        rules.check_closed_config(cfg)
    elif cfg.mlperf.target_auc is None:
        raise ConfigError("mlperf.target_auc: neo mlperf stops at this AUROC; the config sets none "
                          f"(the full benchmark's is {rules.TARGET_AUC})")


def _earlier_results(path: str) -> List[str]:
    """What an earlier ``neo mlperf`` left in ``path``: result logs, run folders, the summary."""
    if not os.path.isdir(path):
        return []
    return sorted(n for n in os.listdir(path)
                  if (n.startswith("result_") and n.endswith(".txt")) or n == "summary.json"
                  or (n.startswith("run_") and os.path.isdir(os.path.join(path, n))))


def prepare_results_dir(path: str, overwrite: bool = False, first_rank: bool = True) -> str:
    """Create ``path`` (a directory); a ConfigError naming it when it is a file, cannot be made,
    or holds an earlier run's results (their logs would mix with this run's: a run's
    metrics.jsonl is appended to, and old result_<seed>.txt files would sit beside a summary
    that does not count them) unless ``overwrite``, which removes those first. Only the first rank
    (``first_rank``) looks for and removes earlier results: under torchrun the others would race it."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--results-dir {path!r}: is a file, not a directory")
    earlier = _earlier_results(path) if first_rank else []
    if earlier and not overwrite:
        raise ConfigError(f"--results-dir {path!r}: holds an earlier run's results ({', '.join(earlier[:4])}"
                          f"{', ...' if len(earlier) > 4 else ''}); pass --overwrite to replace them, or choose "
                          f"another directory")
    for name in earlier:
        full = os.path.join(path, name)
        shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--results-dir {path!r}: cannot create it ({e.strerror})") from None
    return path


def _run_config(cfg, seed: int, results_dir: str):
    out = copy.deepcopy(cfg)
    t = out.train
    t.seed, t.eval_every, t.eval_batches = seed, 0, 0
    t.steps, t.epochs = 0, max(1, math.ceil(out.mlperf.max_epochs - 1e-9))
    t.checkpoint_dir, t.state_digest = None, False
    t.run_dir = os.path.join(results_dir, f"run_{seed}")
    return out


def _drop_caches(wanted: bool, pg) -> bool:
    """Drop the page cache on every host (local rank 0) when asked; True when it was dropped."""
    if not wanted:
        return False
    ok, why = True, ""
    if pg.rank % pg.local_world_size == 0:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError as e:
            ok, why = False, e.strerror or str(e)
    flag = torch.tensor([1 if ok else 0])
    if pg.world_size > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=pg.world)
    if not int(flag):
        raise ConfigError(f"mlperf.drop_caches: writing /proc/sys/vm/drop_caches failed on a host "
                          f"({why or 'another rank'}; it needs root); set mlperf.drop_caches false")
    return True


def _platform(cfg, world_size: int) -> str:
    if cfg.mlperf.submission_platform:
        return cfg.mlperf.submission_platform
    from neo.machine import machine_info

    m = machine_info()
    device = (m["gpu"] or "GPU") if cfg.train.device == "cuda" else m["cpu_model"]
    return f"{world_size}x{device}"


def _log_hyperparameters(log: MLPerfLog, trainer) -> None:
    """The keys the rules require, with the values the trainer actually uses."""
    c = log.constants
    opt = trainer.optimizer
    d = opt.defaults
    name = type(opt).__name__.lower()
    sparse = sorted({(tb.optimizer.type.value, tb.optimizer.lr, tb.optimizer.eps, tb.optimizer.weight_decay,
                      tb.optimizer.initial_accumulator_value) for tb in trainer.tables})
    dense = (name, d["lr"], d.get("eps"), d.get("weight_decay", 0.0), d.get("initial_accumulator_value", 0.0))
    meta = None if sparse == [dense] else {"embedding_optimizers": [
        dict(zip(("type", "lr", "eps", "weight_decay", "initial_accumulator_value"), s)) for s in sparse]}
    log.event(c.GLOBAL_BATCH_SIZE, trainer.B * trainer.W)
    log.event(c.GRADIENT_ACCUMULATION_STEPS, 1)
    log.event(c.SEED, trainer.cfg.train.seed)
    log.event(c.TRAIN_SAMPLES, trainer.train_loader.num_samples)
    log.event(c.EVAL_SAMPLES, trainer.val_loader.num_samples)
    log.event(c.OPT_NAME, name, metadata=meta)
    log.event(c.OPT_BASE_LR, trainer.schedule.base_lr)
    if name == "adagrad":
        log.event(c.OPT_ADAGRAD_LR_DECAY, d["lr_decay"])
        log.event(c.OPT_ADAGRAD_INITIAL_ACCUMULATOR_VALUE, d["initial_accumulator_value"])
        log.event(c.OPT_ADAGRAD_EPSILON, d["eps"])
    log.event(c.OPT_WEIGHT_DECAY, d.get("weight_decay", 0.0))
    log.event(c.OPT_LR_WARMUP_STEPS, trainer.schedule.warmup_steps)
    log.event(c.OPT_LR_DECAY_START_STEP, trainer.schedule.decay_start)
    log.event(c.OPT_LR_DECAY_STEPS, trainer.schedule.decay_steps)


def _run_one(cfg, seed: int, division: str, results_dir: str, pg, say: Callable[..., None],
             trainer_log: Callable[..., None]) -> RunSummary:
    from neo.train.trainer import Trainer

    run_cfg = _run_config(cfg, seed, results_dir)
    path = os.path.join(results_dir, f"result_{seed}.txt")
    log = MLPerfLog(path, enabled=pg.rank == 0)
    c, mp = log.constants, cfg.mlperf
    try:
        log.event(c.CACHE_CLEAR, value=_drop_caches(mp.drop_caches, pg))
        log.start(c.INIT_START)
        log.event(c.SUBMISSION_BENCHMARK, rules.BENCHMARK)
        log.event(c.SUBMISSION_DIVISION, division)
        log.event(c.SUBMISSION_ORG, mp.submission_org)
        log.event(c.SUBMISSION_PLATFORM, _platform(cfg, pg.world_size))
        log.event(c.SUBMISSION_STATUS, mp.submission_status)
        trainer = Trainer(run_cfg, pg=pg, log=trainer_log)
        if trainer.val_loader is None:
            raise ConfigError("data: neo mlperf evaluates on a validation set; the data has none "
                              "(data.val_paths, or a synthetic data set)")
        if division == "closed":
            rules.check_closed_data(trainer.train_loader.num_samples, trainer.val_loader.num_samples)
        _log_hyperparameters(log, trainer)
        cadence = Cadence.of(mp.eval_every_epochs, mp.max_epochs, trainer.steps_per_epoch, trainer.B * trainer.W,
                             trainer.train_loader.num_samples)
        init_stop = log.end(c.INIT_STOP)
        hook = MLPerfHook(log, cadence, float(mp.target_auc))
        if pg.world_size > 1:
            dist.barrier(group=pg.world)            # every rank initialised before the clock starts
        hook.run_start()
        final = trainer.fit(hook)
        hook.stop_unfinished(trainer.step)
    except ConfigError:
        log.close()
        if pg.rank == 0 and os.path.exists(path):
            os.remove(path)          # a run refused while it was set up leaves no partial result file
        raise
    finally:
        log.close()
    last = hook.curve[-1] if hook.curve else None
    run = RunSummary(seed=seed, status=hook.status, time_to_train_s=round(hook.time_to_train_s, 3),
                     final_auc=last.auc if last else float("nan"), epoch_num=cadence.epoch_num(trainer.step),
                     evaluations=len(hook.curve), samples_per_s=float(final.get("samples_per_s") or 0.0),
                     init_s=round((init_stop - log.times_ms[c.INIT_START]) / 1e3, 3), result_file=path,
                     curve=[vars(p) for p in hook.curve])
    say(f"neo mlperf: seed {seed}: {run.status} in {run.time_to_train_s:.2f} s, auc {run.final_auc:.5f} at "
        f"epoch {run.epoch_num:.4f} ({run.evaluations} evaluations)")
    return run


def run_benchmark(cfg, results_dir: str, seeds: int = 1, division: str = "open", config_name: str = "",
                  pg=None, say: Optional[Callable[..., None]] = None, print_summary: bool = True) -> Dict[str, Any]:
    """Run ``seeds`` runs of ``cfg``; return the summary (written to ``results_dir/summary.json``
    by rank 0, and printed there unless ``print_summary`` is false). ``pg``: process groups
    (default: from torchrun's environment, or one local rank)."""
    from neo.train.build import init_process_groups, validate_training_config

    check_request(cfg, division, seeds)
    validate_training_config(cfg, outputs=False)        # its runs write under results_dir
    prepare_results_dir(results_dir, first_rank=(pg.rank if pg is not None else int(os.environ.get("RANK", "0"))) == 0)
    own_pg = pg is None
    pg = pg or init_process_groups(cfg.train)
    say = say or (lambda *a, **k: print(*a, file=sys.stderr, flush=True, **k))
    rank0_say = say if pg.rank == 0 else (lambda *a, **k: None)
    try:
        if division == "closed":
            rules.check_closed_run(cfg, pg.world_size)
        quiet = lambda *a, **k: None              # noqa: E731 - the plan report of the first run is enough
        runs = [_run_one(cfg, cfg.train.seed + i, division, results_dir, pg, rank0_say, say if i == 0 else quiet)
                for i in range(seeds)]
        summary = summary_dict(runs, division, float(cfg.mlperf.target_auc), config_name, pg.world_size,
                               rules.RESULT_RUNS)
        if pg.rank == 0:
            write_summary(os.path.join(results_dir, "summary.json"), summary)
            if print_summary:
                print(format_summary(summary), flush=True)
                print(f"wrote {os.path.join(results_dir, 'summary.json')}", flush=True)
        return summary
    finally:
        if own_pg:
            end_process_groups()          # the runs' trainers are garbage by now: freed with their groups
