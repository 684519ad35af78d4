"""``neo train CONFIG [key=value ...]``: train the config's model (one process, or under torchrun).

    neo train configs/train_tiny.yaml
    neo train configs/train_tiny.yaml model.dense_arch=[64,16] optim.lr=0.01 train.steps=100
    torchrun --standalone --nproc-per-node 2 -m neo.train configs/main_job.yaml
    neo train configs/pipeline_deep_mlp.yaml      # parallel.pipeline.stages 2: relaunched under torchrun, 2 ranks

Prints the sharding plan, a progress bar (rank 0, on stderr) and, last on stdout, one line of
JSON with the final metrics (``samples_per_s``, ``auc``, ``logloss``, ``steps``, ``best_auc``...).
Exit status: 0; 2 for a config error (found when the config is read, or while the run is set
up: a plan that does not fit, a missing file the config names), or a ``NEO_CPU_ISA`` or
``NEO_INTERACTION_TILES`` the C++ kernels cannot honour; 1 when the training loss
stops being finite (the run stops there: ``TrainingDiverged``), or when ``train.target_auc_delta``
is set and the final AUC is below ``best_auc - target_auc_delta``; 128 + the signal's number
(143 for SIGTERM) when a signal of ``train.stop_signals`` stopped the run (after a checkpoint
of its last step when ``train.checkpoint_dir`` is set; the JSON line then has ``stopped``,
``checkpoint`` and no evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from neo.config import ConfigError, load_config

__all__ = ["main", "run", "setup_errors", "input_errors", "report_error", "report_final"]


def setup_errors() -> tuple:
    """What Trainer(cfg) raises for a config this run cannot honour (neo train exits 2 on them)."""
    from neo.distributed.plan_view import PlanError
    from neo.planner import PlanningError
    from neo.train.checkpoint import CheckpointError

    # a file or directory the config names is missing or of the wrong kind
    paths = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)
    # CheckpointError here: the checkpoint to resume from does not fit the config, or none is intact,
    # or another run holds the lease on train.checkpoint_dir (neo/train/checkpoint/lease.py)
    return (ConfigError, PlanningError, PlanError, CheckpointError) + paths + input_errors()


def input_errors() -> tuple:
    """What the run's inputs raise when they are not what it needs, at setup or mid-run (neo train
    exits 2 on them, with the one line): a Parquet file or an MLPerf day file missing a column, cut
    short, or holding a bad label, dense value or id (the message names the file and the row); a
    cached table whose backing store cannot be made where its config says, or whose cache is
    smaller than a batch's distinct rows (the message names the table and both numbers)."""
    from data_pipeline.mlperf_layout import LayoutError
    from data_pipeline.schema import DataFileError
    from neo.distributed.input_dist import DistributedInputError
    from neo.embedding.cache.index import CacheCapacityError
    from neo.embedding.cache.store import CacheStoreError
    from neo.embedding.checks import EmbeddingInputError

    # the lookups' own checks (an id past its table in a batch the loaders did not check, e.g. a
    # plan or hook that feeds other batches): the message names the table, feature and sample
    return (DataFileError, LayoutError, CacheStoreError, CacheCapacityError, DistributedInputError,
            EmbeddingInputError)


def report_error(e: BaseException, pg, status: int) -> int:
    """``status`` after a one-line ``neo train: error:`` (no traceback); the process groups this
    command made (``pg`` None) are ended first."""
    from neo.distributed import end_process_groups

    print(f"neo train: error: {e}", file=sys.stderr, flush=True)
    if pg is None:
        end_process_groups()
    return status


def report_final(final: Dict[str, Any], rank: int, pg, status: int) -> int:
    """``status`` after the final line of JSON, ``final``, on stdout (rank 0; NaN metrics, as of no
    samples, as null); the process groups this command made (``pg`` None) are ended first."""
    from data_pipeline.writer import json_ready
    from neo.distributed import end_process_groups

    if rank == 0:
        print(json.dumps(json_ready(final), allow_nan=False), flush=True)
    if pg is None:
        end_process_groups()
    return status


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neo train", description="Train DLRM / DCNv2 from a config file.")
    p.add_argument("config", help="Neo YAML config (sections tables, topology, model, data, optim, sharding, train; optional mlperf, "
                                     "parallel, async_train)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=0.01 model.dense_arch=[512,256,64]")
    return p


def run(cfg, pg=None) -> int:
    """Train ``cfg``; print the final JSON line (rank 0); return the exit status."""
    from neo.train.trainer import Trainer

    if cfg.async_train.mode == "wsp":                    # bounded staleness: a trainer of its own
        from neo.async_train.wsp import check_wsp_config, run as run_wsp

        try:
            check_wsp_config(cfg)
        except ConfigError as e:
            print(f"neo train: error: {e}", file=sys.stderr, flush=True)
            return 2
        return run_wsp(cfg, pg)
    try:
        trainer = Trainer(cfg, pg=pg)
    except setup_errors() as e:       # the config asks for something this run cannot do: exit 2, as a config error
        return report_error(e, pg, 2)
    from neo.distributed.comms import CollectiveError
    from neo.train.checkpoint import CheckpointError
    from neo.train.trainer import TrainingDiverged

    try:
        final, rank = trainer.fit(), trainer.rank
    except TrainingDiverged as e:
        return report_error(e, pg, 1)
    except CollectiveError as e:                      # another rank failed or stalled: named, one line
        return report_error(e, pg, 1)
    except CheckpointError as e:                      # a save that failed mid-run (disk full), a lost lease
        return report_error(e, pg, 1)
    except input_errors() as e:                       # a bad data row, or a cache too small, met as the run goes
        return report_error(e, pg, 2)
    del trainer                      # its process groups are freed by end_process_groups, not at exit
    status = 0
    delta = cfg.train.target_auc_delta
    if final.get("stopped"):                     # a signal of train.stop_signals ended it (neo/train/stop.py)
        status = final["exit_status"]
        if rank == 0:
            where = f"checkpoint {final['checkpoint']}: the same command resumes there (train.resume)" \
                if final["checkpoint"] else "nothing saved (no train.checkpoint_dir)"
            print(f"neo train: stopped by {final['stopped']} after step {final['steps']}; {where}",
                  file=sys.stderr, flush=True)
    elif delta is not None and final.get("best_auc") is not None:
        target = final["best_auc"] - delta
        final["target_auc"] = round(target, 6)
        final["target_met"] = bool(final["auc"] is not None and final["auc"] >= target)
        status = 0 if final["target_met"] else 1
    if rank == 0:
        if "target_met" in final:
            verdict = "reached" if final["target_met"] else "did NOT reach"
            print(f"neo train: auc {final['auc']:.4f} {verdict} best_auc {final['best_auc']:.4f} - {delta} "
                  f"= {final['target_auc']:.4f}", file=sys.stderr, flush=True)
        if final.get("eval_samples") == 0:
            print("neo train: warning: the validation data held no samples: auc, logloss, ne, calibration and "
                  "accuracy are null",
                  file=sys.stderr, flush=True)
    return report_final(final, rank, pg, status)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        for section in ("model", "data", "optim", "sharding", "train"):
            if not hasattr(cfg, section):
                raise ConfigError(f"config: this Neo build has no '{section}' section (neo/config/loader.py)")
        from neo.train.build import validate_training_config

        validate_training_config(cfg)
    except ConfigError as e:
        print(f"neo train: error: {e}", file=sys.stderr)
        return 2
    from neo.cpp import KernelSettingError, check_kernel_settings

    try:
        check_kernel_settings()
    except KernelSettingError as e:                     # the environment asks for kernels this CPU or build lacks
        print(f"neo train: error: {e}", file=sys.stderr)
        return 2
    stages = cfg.parallel.pipeline.stages if hasattr(cfg, "parallel") else 1
    if stages > 1 and "WORLD_SIZE" not in os.environ:
        try:
            _check_before_launch(cfg, stages)
        except ConfigError as e:
            print(f"neo train: error: {e}", file=sys.stderr)
            return 2
        return _torchrun(stages, [args.config, *args.overrides])
    return run(cfg)


def _check_before_launch(cfg, ranks: int) -> None:
    """What the pipeline's ranks would each find at start (layers to cut, micro-batches, the
    split, a WSP config), checked once here instead of by ``ranks`` processes after the launch."""
    from neo.pipeline.layers import dense_layers
    from neo.pipeline.trainer import check_pipelined_train

    check_pipelined_train(cfg)
    if cfg.async_train.mode == "wsp":
        from neo.async_train.wsp import check_wsp_config

        check_wsp_config(cfg)
    spec = cfg.dense_spec()
    if spec is None:
        return                              # tables of several dims: validate_training_config said so
    layers = dense_layers(cfg.model, spec.num_dense, spec.num_features, spec.dim)
    cfg.parallel.pipeline.check(len(layers), cfg.train.batch_size, ranks)


_STATUS_DIR = "NEO_EXIT_STATUS_DIR"
"""Environment variable naming the folder where each rank of a relaunched run writes its exit
status (``rank-<R>``): torchrun exits 1 whatever its workers' statuses, and ``neo train`` returns
theirs (2 for a config error, 143 for a stop by SIGTERM, ...)."""


def record_exit_status(status: int) -> int:
    """``status``, written first to ``$NEO_EXIT_STATUS_DIR/rank-<RANK>`` where that is set (a rank of
    a run ``neo train`` relaunched under torchrun)."""
    folder = os.environ.get(_STATUS_DIR)
    if folder:
        try:
            with open(os.path.join(folder, f"rank-{os.environ.get('RANK', '0')}"), "w") as f:
                f.write(str(int(status)))
        except (OSError, ValueError, TypeError):
            pass                                      # the torchrun status stands
    return status


def _ranks_status(folder: str, torchrun_status: int) -> int:
    """The run's status from its ranks': the non-zero status written first (the rank that failed
    first, its cause; the others fail after it, e.g. on a collective), else torchrun's."""
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("rank-"):
            path = os.path.join(folder, name)
            try:
                with open(path) as f:
                    found.append((os.stat(path).st_mtime_ns, int(name[5:]), int(f.read().strip())))
            except (OSError, ValueError):
                continue
    failed = [s for _, _, s in sorted(found) if s != 0]
    return failed[0] if failed and torchrun_status != 0 else torchrun_status


def _torchrun(ranks: int, argv: List[str]) -> int:
    """``neo train`` of a pipelined config in one process: relaunch it on ``ranks`` local ranks
    (one per pipeline stage) with ``torchrun --standalone``. torchrun's log folders go to a
    temporary folder removed when it ends (without ``--log-dir`` it leaves a ``torchelastic_*``
    folder in the temporary directory at every launch); the ranks' output stays on the console."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="neo-torchrun-") as logs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               "--log-dir", os.path.join(logs, "torchrun"), "-m", "neo.train", *argv]
        print(f"neo train: parallel.pipeline.stages = {ranks}: running {' '.join(cmd[1:])}", file=sys.stderr,
              flush=True)
        statuses = os.path.join(logs, "status")
        os.makedirs(statuses)
        child = subprocess.Popen(cmd, env=dict(os.environ, **{_STATUS_DIR: statuses}))
        return _ranks_status(statuses, _wait_forwarding_signals(child))


# Signals passed on to a relaunched torchrun (which passes SIGTERM and SIGHUP on to its workers:
# train.stop_signals then stops them cleanly). SIGINT is not: Ctrl-C reaches the child through
# the terminal's process group already.
_FORWARDED = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")


def _wait_forwarding_signals(child) -> int:
    """Wait for ``child``, passing it the signals of _FORWARDED this process gets (else this
    process would die of them and leave its torchrun running); its exit status, 128 + N when a
    signal N ended it."""
    import signal

    previous = {}
    for name in _FORWARDED:
        num = getattr(signal, name)
        previous[num] = signal.signal(num, lambda n, frame: child.send_signal(n))
    try:
        while True:
            try:
                rc = child.wait()
                break
            except KeyboardInterrupt:          # Ctrl-C: the child has it too; wait for its shutdown
                continue
    finally:
        for num, handler in previous.items():
            signal.signal(num, handler)
    return 128 - rc if rc < 0 else rc
