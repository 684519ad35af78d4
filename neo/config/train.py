"""The ``optim``, ``sharding`` and ``train`` sections of Neo's YAML config.

``optim``: the dense optimizer (SGD, Adagrad, Adam) and the learning-rate schedule (linear
warmup, constant, polynomial decay; :class:`neo.train.schedule.LRSchedule`). The schedule
multiplies every learning rate, the sparse ones included: at step t each table's fused
optimizer runs at ``table lr x schedule(t) / optim.lr``. Sparse optimizers are per table
(``tables[k].optimizer``); ``optim.sparse``, when given, replaces the optimizer of every
table that leaves its ``optimizer`` at the default.

``sharding``: ``planner: auto`` lets the planner choose every table's sharding (within the
``tables[k].sharding_types`` constraints); ``types: {table: sharding_type}`` pins tables
(fed to the planner as constraints). ``planner: explicit`` requires a type for every table.

``train``: batch size per rank, length (steps or epochs), evaluation and checkpoint cadence,
run directory, seed, backends.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from neo.config.embedding import ConfigError, choice
from neo.config.signals import stop_signal_names
from neo.config.tables import SHARDING_TYPES, OptimizerEntry

__all__ = ["DenseOptimizerType", "OptimConfig", "ShardingConfig", "TrainConfig"]


class DenseOptimizerType(str, enum.Enum):
    """Optimizer of the dense (MLP) parameters, as torch.optim implements it."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAM = "adam"


@dataclass
class OptimConfig:
    """Dense optimizer and learning-rate schedule."""

    type: str = "adagrad"
    """Dense optimizer: sgd, adagrad or adam."""
    lr: float = 0.01
    """Dense learning rate; the schedule's base (sparse lrs scale with it, see module doc)."""
    momentum: float = 0.0
    """SGD momentum."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's (beta1, beta2)."""
    eps: float = 1e-8
    """Denominator epsilon of adagrad and adam."""
    initial_accumulator_value: float = 0.0
    """Adagrad's starting sum of squared gradients (torch's ``initial_accumulator_value``). From 0
    the first step is about ``lr * sign(grad)`` for every element, however small its gradient."""
    weight_decay: float = 0.0
    """L2 penalty of the dense parameters."""
    warmup_steps: int = 0
    """Steps of linear warmup from lr / warmup_steps to lr."""
    decay_start: int = 0
    """Step at which polynomial decay starts (after warmup)."""
    decay_steps: int = 0
    """Steps of decay (0 = no decay)."""
    decay_power: float = 2.0
    """Exponent of the polynomial decay."""
    end_ratio: float = 0.0
    """Floor of the decayed lr, as a fraction of lr."""
    sparse: Optional[OptimizerEntry] = None
    """Sparse optimizer for every table whose ``optimizer`` is left at the default (null = per table)."""

    def validate(self, where: str = "optim") -> None:
        self.type = choice(self.type, [m.value for m in DenseOptimizerType], f"{where}.type")
        for name in ("lr", "eps", "weight_decay", "momentum", "decay_power", "initial_accumulator_value"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"{where}.{name}: must be a finite number >= 0, got {v!r}")
        if not 0 <= self.end_ratio <= 1:
            raise ConfigError(f"{where}.end_ratio: must be in [0, 1] (the decayed lr's floor as a fraction of lr), "
                              f"got {self.end_ratio!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"{where}.betas: must be two values in [0, 1), got {list(self.betas)}")
        for name in ("warmup_steps", "decay_start", "decay_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{where}.{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.decay_steps > 0 and self.decay_start < self.warmup_steps:
            # the decay would be part done when the warmup ends: the lr would fall at once
            raise ConfigError(f"{where}.decay_start: {self.decay_start} is inside the warmup ({where}.warmup_steps = "
                              f"{self.warmup_steps}); the decay starts after the warmup: set decay_start >= "
                              f"warmup_steps")
        if self.sparse is not None:
            self.sparse.to_config(f"{where}.sparse")


class PlannerMode(str, enum.Enum):
    AUTO = "auto"
    """The planner picks each table's sharding (honouring ``types`` and the tables' constraints)."""
    EXPLICIT = "explicit"
    """Every table's type comes from ``types``; the planner only places the shards."""


@dataclass
class ShardingConfig:
    """How the embedding tables are sharded across ranks."""

    planner: str = "auto"
    """``auto`` (planner chooses) or ``explicit`` (``types`` gives every table's sharding type)."""
    types: Dict[str, str] = field(default_factory=dict)
    """Sharding type per table name: data_parallel, table_wise, row_wise, column_wise,
    table_row_wise, table_column_wise (planner constraints)."""
    partitioner: str = "auto"
    """Restrict the planner to one partitioner (``auto`` = the best of all)."""
    plan_file: Optional[str] = None
    """Use this plan JSON (``neo plan --out``) instead of planning."""
    cost_constants: Optional[str] = None
    """JSON of the planner's cost constants (``neo calibrate --out``); null: this machine's
    calibration if ``neo calibrate`` has run, else the built-in defaults of its device kind."""
    cache_sample_batches: int = 16
    """Global batches of training data on which ``neo cache-report``'s simulator measures the
    miss-ratio curve of every table the planner may cache, counted once each simulated cache is
    warm (0: the built-in skew model; :func:`neo.train.build.measure_cache_curves`)."""
    cache_warmup_batches: int = 512
    """The most global batches read before those for the simulated caches to warm up (misses
    twice the capacity); a cache still cold after them takes the skew model fitted to the data."""
    fuse_output_dists: bool = True
    """With every rank on one host (CPU), every sharding type's pooled embeddings in one AlltoAll
    per direction (the same result bit for bit); false: one output distribution per type."""

    def validate(self, where: str = "sharding") -> None:
        from neo.planner.planner import PARTITIONERS      # here: neo.planner imports neo.config

        self.planner = choice(self.planner, [m.value for m in PlannerMode], f"{where}.planner")
        self.partitioner = choice(self.partitioner, ["auto", *PARTITIONERS], f"{where}.partitioner")
        if self.cache_sample_batches < 0:
            raise ConfigError(f"{where}.cache_sample_batches: must be >= 0, got {self.cache_sample_batches}")
        if self.cache_warmup_batches < 0:
            raise ConfigError(f"{where}.cache_warmup_batches: must be >= 0, got {self.cache_warmup_batches}")
        for name, t in self.types.items():
            self.types[name] = choice(t, SHARDING_TYPES, f"{where}.types.{name}")

    def check_tables(self, names, where: str = "sharding") -> None:
        unknown = [n for n in self.types if n not in names]
        if unknown:
            raise ConfigError(f"{where}.types: unknown tables {unknown}; tables: {list(names)}")
        if self.planner == "explicit":
            missing = [n for n in names if n not in self.types]
            if missing:
                raise ConfigError(f"{where}.types: planner: explicit needs a type for every table; missing {missing}")


MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""The longest ``train.collective_timeout_s`` (30 days)."""
MAX_THREADS = 1024
"""The most ``train.threads`` (torch's first matrix product crashed with 99,999,999)."""


@dataclass
class TrainConfig:
    """Length, cadence, checkpoints and runtime of a training run."""

    batch_size: int = 512
    """Samples per rank per step (the global batch is batch_size x world size)."""
    steps: int = 0
    """Training steps (0 = ``epochs`` full epochs)."""
    epochs: int = 1
    """Epochs over the training data when ``steps`` is 0."""
    eval_every: int = 0
    """Evaluate every this many steps (0 = only at the end; the end is always evaluated)."""
    eval_batch_size: int = 0
    """Samples per rank per evaluation batch (0 = ``batch_size``): evaluation keeps no activations
    for a backward pass, so it can take larger batches, as TorchRec's DLRM example does
    (``--test_batch_size``). The metrics do not depend on it (every sample is evaluated once)."""
    eval_batches: int = 0
    """Validation batches (of ``eval_batch_size``) per rank per evaluation (0 = the whole validation set)."""
    log_every: int = 50
    """Write training loss and throughput to the metrics file every this many steps."""
    checkpoint_dir: Optional[str] = None
    """Checkpoint directory (null = none); ``DIR/step-<N>`` and ``DIR/latest``."""
    checkpoint_every: int = 0
    """Checkpoint every this many steps (0 = only at the end when checkpoint_dir is set)."""
    checkpoint_keep: int = 2
    """Complete checkpoints kept (the newest ones; older ones are removed once a newer one is committed)."""
    resume: bool = True
    """Resume from ``checkpoint_dir``'s newest intact checkpoint when there is one."""
    checkpoint_async: bool = True
    """Write checkpoints in the background (``torch.distributed.checkpoint.async_save``: the
    state is copied, training goes on while the copy is written); false writes in the step."""
    checkpoint_lease_s: float = 60.0
    """Seconds of the lease a run holds on ``checkpoint_dir`` (``DIR/lease.json``, renewed every
    quarter of it): another run on the directory is refused while the lease is live, and takes
    over one not renewed for this long (or whose process is gone); see docs/reliability.md."""
    stop_signals: List[str] = field(default_factory=list)
    """Signals that stop the run cleanly instead of killing it, e.g. ``[SIGTERM]`` (what torchrun,
    Kubernetes and schedulers send before they kill) or ``[SIGUSR1]`` (SLURM's ``--signal``): the
    ranks agree on a step (the next one with one rank, the next ``log_every`` step with several),
    write a checkpoint there when ``checkpoint_dir`` is set, give up the lease and exit with 128 +
    the signal's number; a second such signal kills at once. Empty (the default): every signal
    keeps its default action. See docs/reliability.md."""
    state_digest: bool = True
    """Put ``state_sha256`` (a digest of every parameter and optimizer state) in the final JSON line."""
    run_dir: str = "runs/neo"
    """Metrics (``metrics.jsonl``), TensorBoard events and the plan go here."""
    cache_store_dir: Optional[str] = None
    """Directory of the backing files of cached tables on mmap stores (default: RUN_DIR/embedding_store);
    a table's ``cache_dir`` overrides it. The files are unlinked once mapped: nothing stays behind."""
    seed: int = 0
    """Seed of dense initialisation, embedding initialisation and the data shuffle."""
    embedding_backend: str = "auto"
    """Embedding kernels: auto, reference, cpu, triton, fbgemm."""
    dist_backend: str = "gloo"
    """torch.distributed backend: gloo (CPU) or nccl (GPU)."""
    collective_timeout_s: float = 600.0
    """A collective (gloo, the shared-memory exchange, a checkpoint's agreement) waiting longer
    than this for another rank fails with an error naming the operation and the ranks, instead
    of waiting forever for a rank that died or stopped."""
    shm_collectives: bool = True
    """Carry the embedding AlltoAlls and AllGathers, and DDP's gradient AllReduce, between ranks
    of one host through shared memory instead of gloo's sockets (see neo/distributed/shm.py and
    ddp_hook.py); gloo groups only."""
    device: str = "cpu"
    """cpu or cuda."""
    dense_dtype: str = "fp32"
    """Compute type of the MLPs and the interaction: fp32, or bf16 (autocast; fp32 weights and embeddings)."""
    pipelined: bool = True
    """Overlap data, input distribution and compute across steps (see neo/train/pipeline.py)."""
    progress: bool = True
    """tqdm progress bar on rank 0."""
    threads: int = 0
    """torch intra-op threads per process (0 = leave torch's default)."""
    retain_freed_memory: bool = True
    """Keep freed host memory in the process (glibc malloc tuning, see neo/host_memory.py): no
    page faults for the per-step tensors, at the price of keeping the peak heap."""
    target_auc_delta: Optional[float] = None
    """When set and the data reports its best AUC: fail (exit 1) unless auc >= best_auc - delta."""
    trace: Optional[str] = None
    """Write a timeline of the run here (Chrome / Perfetto trace JSON, every rank's spans in one
    file written by rank 0; see neo/train/trace.py and docs/async.md); null: no tracing (no recorder)."""
    trace_steps: int = 200
    """Steps traced (the first ones; evaluations and checkpoints after them are still traced), so
    that a long run's trace stays bounded."""

    @property
    def eval_batch(self) -> int:
        """Samples per rank per evaluation batch (``eval_batch_size``, else ``batch_size``)."""
        return self.eval_batch_size or self.batch_size

    def validate(self, where: str = "train") -> None:
        if self.batch_size <= 0:
            raise ConfigError(f"{where}.batch_size: must be > 0, got {self.batch_size}")
        for name in ("steps", "eval_every", "eval_batch_size", "eval_batches", "checkpoint_every", "threads",
                     "trace_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{where}.{name}: must be >= 0, got {getattr(self, name)}")
        if self.seed < 0:
            raise ConfigError(f"{where}.seed: must be >= 0, got {self.seed}")
        if self.checkpoint_keep < 1:
            raise ConfigError(f"{where}.checkpoint_keep: must be >= 1, got {self.checkpoint_keep}")
        if not 0 < self.collective_timeout_s <= MAX_TIMEOUT_S:     # inf: datetime.timedelta overflows
            raise ConfigError(f"{where}.collective_timeout_s: must be > 0 and at most {MAX_TIMEOUT_S:.0f} "
                              f"(30 days), got {self.collective_timeout_s!r}")
        if self.threads > MAX_THREADS:                                # torch crashes on absurd counts
            raise ConfigError(f"{where}.threads: at most {MAX_THREADS} torch threads per process, got {self.threads}")
        if not (self.checkpoint_lease_s > 0 and math.isfinite(self.checkpoint_lease_s)):
            raise ConfigError(f"{where}.checkpoint_lease_s: must be a finite number > 0, "
                              f"got {self.checkpoint_lease_s!r}")
        if self.log_every <= 0:
            raise ConfigError(f"{where}.log_every: must be > 0, got {self.log_every}")
        self.stop_signals = stop_signal_names(self.stop_signals, f"{where}.stop_signals")
        if self.steps == 0 and self.epochs <= 0:
            raise ConfigError(f"{where}.epochs: must be > 0 when steps is 0, got {self.epochs}")
        self.embedding_backend = choice(self.embedding_backend, ["auto", "reference", "cpu", "triton", "fbgemm"],
                                        f"{where}.embedding_backend")
        self.dist_backend = choice(self.dist_backend, ["gloo", "nccl"], f"{where}.dist_backend")
        self.device = choice(self.device, ["cpu", "cuda"], f"{where}.device")
        self.dense_dtype = choice(self.dense_dtype, ["fp32", "bf16"], f"{where}.dense_dtype")
        if self.target_auc_delta is not None and self.target_auc_delta < 0:
            raise ConfigError(f"{where}.target_auc_delta: must be >= 0 or null, got {self.target_auc_delta}")
