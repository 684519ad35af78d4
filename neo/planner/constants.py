"""The cost model's constants: what a machine does per byte, per id, per flop, per collective.

:class:`CostConstants` holds one machine's numbers (format 2). They come, in this order, from:

1. the file a config names (``sharding.cost_constants: PATH``);
2. the calibration file of this machine, written by ``neo calibrate`` (``neo.calibrate``) in the
   user's cache directory (:func:`calibration_path`), with one set of constants per world size
   it was run at (ranks share the machine's cores and memory bandwidth, so the numbers depend
   on how many run at once);
3. the built-in defaults of the device kind found (:func:`builtin_constants`: cpu, h100, h200).

A file from another machine kind, or in an older format, gives a warning and the defaults; a
rate or a time that is zero or negative, or any constant that is not finite (Python's json reads
``Infinity`` and ``NaN``), is refused naming the constant and the file.

Pure Python: no torch, no process group (the caller says which device kind it runs on).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, Optional, Tuple

from neo.planner.types import PlanningError

__all__ = ["CostConstants", "FORMAT", "builtin_constants", "calibration_path", "machine_key", "load_constants",
           "resolve_constants", "DEVICE_KINDS"]

FORMAT = 2
DEVICE_KINDS = ("cpu", "h100", "h200")

# Fields that are settings rather than measurements, or extra costs that may be nil: zero is allowed.
KIND_OVERHEADS = {"row_wise": "row_wise_overhead", "column_wise": "column_wise_overhead",
                  "data_parallel": "data_parallel_overhead", "table_row_wise": "table_row_wise_overhead",
                  "table_column_wise": "table_column_wise_overhead"}
_SETTINGS = {"imbalance_weight", "memory_headroom", "cache_load_factor", "format", "world_size",
             "pooled_elem_s", "dense_elem_s", "data_batch_s", "data_bag_s", "data_id_s", "cache_batch_s",
             "cache_access_s", "weighted_call_s", "weighted_feature_s", "weighted_bag_s", "weighted_id_s",
             *KIND_OVERHEADS.values()}


@dataclass(frozen=True)
class CostConstants:
    """One machine's constants of the cost model (docs/planner.md, "Cost model").

    Times are seconds, rates bytes/s or flop/s. A table's shard, per step:
    forward = bags x ``lookup_bag_s`` + ids x (``lookup_id_s`` + row bytes / lookup bandwidth);
    backward + optimizer = ids x ``update_id_s`` + distinct rows x (``update_row_s`` + 2 x (row +
    state bytes) / update bandwidth); each bandwidth goes from its ``_hot`` value (the table's
    bytes fit the caches: at most ``hot_bytes``) to its ``_cold`` value (``cold_bytes`` and more).
    A collective costs its latency + the bytes a rank sends / bandwidth.
    """

    device_kind: str = "h100"
    """cpu, h100 or h200: which machine these describe."""
    source: str = "built-in"
    """Where the numbers come from (a calibration run, a datasheet)."""
    world_size: int = 0
    """Ranks per machine the numbers were measured with (0: any)."""
    # embedding lookups (fused kernels)
    lookup_bag_s: float = 2e-11
    """Forward: per bag (one feature of one sample)."""
    lookup_id_s: float = 2e-11
    """Forward: per id, besides reading its row."""
    lookup_bw_hot: float = 3.0e12
    """Forward: bytes/s reading rows of a table that fits the caches."""
    lookup_bw_cold: float = 1.6e12
    """Forward: bytes/s reading rows of a table far larger than the caches."""
    update_id_s: float = 5e-11
    """Backward + optimizer: per id (sort, gradient gather)."""
    update_row_s: float = 2e-11
    """Backward + optimizer: per distinct row updated."""
    update_bw_hot: float = 2.0e12
    """Backward + optimizer: bytes/s reading and writing rows and state of a cache-sized table."""
    update_bw_cold: float = 1.2e12
    """Backward + optimizer: bytes/s for a table far larger than the caches."""
    hot_bytes: float = 40e6
    """Table bytes (rows and state) up to which rows come at the ``_hot`` bandwidths."""
    cold_bytes: float = 2e9
    """Table bytes from which rows come at the ``_cold`` bandwidths (log-linear in between)."""
    kernel_overhead: float = 10e-6
    """Per shard per step: its share of the kernels' setup."""
    lookup_call_s: float = 30e-6
    """Per rank per step: the embedding module's forward and backward calls (launches, bookkeeping)."""
    # learnable per-id weights (position weights), forward + backward beyond the lookup: the
    # weights' module and read, their gradient's pass over the rows and bags; ``neo calibrate``
    # fits them to lookups timed with and without ``PositionWeights``; 0 in files from before it did
    weighted_call_s: float = 0.0
    """Per rank per step holding a feature with learnable per-id weights: the calls."""
    weighted_feature_s: float = 0.0
    """Per such feature of a shard (its weights' part of the reads and gradients)."""
    weighted_bag_s: float = 0.0
    """Per bag of such a feature."""
    weighted_id_s: float = 0.0
    """Per id of such a feature."""
    # collectives of the embeddings (AlltoAll, ReduceScatter, AllGather)
    intra_bw: float = 300e9
    """Bytes/s a rank sends to ranks of its node (NVLink4 ~450 GB/s; shared memory on a CPU)."""
    inter_bw: float = 25e9
    """Bytes/s a rank sends to other nodes (one 200-400 Gb/s NIC per GPU)."""
    intra_latency: float = 15e-6
    """Fixed cost of one collective within a node."""
    inter_latency: float = 40e-6
    """Fixed cost of one collective across nodes."""
    input_dist_overhead: float = 60e-6
    """Per step: the input distribution's bookkeeping besides its collectives (regrouping ids)."""
    output_dist_overhead: float = 60e-6
    """Per step: the output distribution's bookkeeping besides its collectives (assembling columns)."""
    # per bag (sample x feature) of the global batch of a table of the kind, on every rank: its code path's work
    # beyond a table-wise table's (parts per rank to select ids for, bucketize, reduce or
    # reassemble; replicas' gathers); ``neo calibrate`` measures each as a small model's step with
    # every table of that kind minus with every table table-wise, less what the rest of the model
    # explains, over the step's bags
    row_wise_overhead: float = 0.0
    column_wise_overhead: float = 0.0
    data_parallel_overhead: float = 0.0
    table_row_wise_overhead: float = 0.0
    table_column_wise_overhead: float = 0.0
    # the dense part
    allreduce_bw: float = 150e9
    """Bytes/s of the dense gradients' AllReduce (DDP), per rank."""
    allreduce_latency: float = 40e-6
    """Fixed cost of one AllReduce bucket."""
    dense_flops: float = 250e12
    """Flop/s of the MLPs (forward and backward)."""
    dense_layer_s: float = 30e-6
    """Per MLP layer per step (forward + backward launches)."""
    dense_elem_s: float = 0.0
    """Per activation element of an MLP layer (B x (in + out)) per step, forward + backward: the
    bias, ReLU, copies and their gradients, which grow with the batch and not with the flops
    (on a CPU a small layer's time at B 1024 is about half its time at B 2048). ``neo calibrate``
    fits it from the same layers timed at two batch sizes; 0 in files from before it did."""
    interaction_flops: float = 60e12
    """Flop/s of the interaction (dot products, cross layers' elementwise work)."""
    dense_optimizer_bw: float = 1.5e12
    """Bytes/s of the dense optimizer's pass over parameters and state."""
    data_batch_s: float = 0.0
    """Loader CPU seconds per batch of a rank, Parquet decoding included (on the step's path only
    when loading inline; on a CPU it competes for the cores: ``neo.planner.step_model``)."""
    data_bag_s: float = 0.0
    """Loader CPU seconds per bag (sample x feature) of a rank's batch (a shuffled row's copy)."""
    data_id_s: float = 0.0
    """Loader CPU seconds per sparse id of a rank's batch."""
    pooled_elem_s: float = 0.0
    """Per element of the pooled embeddings a rank's dense part takes in (B x F x D) per step:
    moving them between the lookup, the output distribution and the model and back (concatenation,
    feature order, contiguous gradients, autograd bookkeeping). ``neo calibrate`` measures it as
    the growth of the real trainer's dense residual from a narrow to a wide small model."""
    step_overhead: float = 300e-6
    """Per step: the rest of the loop (Python, loss, logging)."""
    # the cache
    host_bw: float = 25e9
    """Bytes/s moving cached rows between the backing store and the cache."""
    cache_miss_latency: float = 0.1e-6
    """Per missing row of a cached table beyond its bytes (the victim's choice, the row's and the
    victim's copies, page faults of a file store)."""
    cache_batch_s: float = 0.0
    """Per cached shard per step: the admission's fixed work (``TableCache.prefetch``'s calls)."""
    cache_access_s: float = 0.0
    """Per distinct row a cached shard's batch asks for, hit or miss: its look-up in the cache's
    index, its count and pin (and the lookahead window's marks). ``neo calibrate`` measures the
    three cache terms on a Zipf stream; 0 in files from before it did."""
    # encodings and the planner's objective
    id_bytes: int = 4
    """Bytes per id on the wire (int32)."""
    act_bytes: int = 4
    """Bytes per element of pooled embeddings and their gradients (fp32)."""
    cache_load_factor: float = 0.2
    """Cache share of the rows assumed for a cached table whose plan does not say (evaluate_plan)."""
    imbalance_weight: float = 0.25
    """Objective = max rank time + imbalance_weight x (max - mean) rank time."""
    memory_headroom: float = 0.0
    """Fraction of each device's memory kept free (0 = use all of ``Device.hbm_bytes``)."""
    format: int = FORMAT
    """Version of this layout (older files are refused with a warning)."""

    def __post_init__(self) -> None:
        if self.device_kind not in DEVICE_KINDS:
            raise PlanningError(f"cost constants: device_kind {self.device_kind!r} is not one of {list(DEVICE_KINDS)}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("device_kind", "source"):
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise PlanningError(f"cost constant {f.name}: expected a number, got {v!r}")
            if isinstance(v, float) and not math.isfinite(v):
                raise PlanningError(f"cost constant {f.name}: must be a finite number, got {v!r}")
            if f.name in _SETTINGS:
                if v < 0:
                    raise PlanningError(f"cost constant {f.name}: must be >= 0, got {v!r}")
            elif not v > 0:
                raise PlanningError(f"cost constant {f.name}: must be > 0, got {v!r}")
        if not self.hot_bytes < self.cold_bytes:
            raise PlanningError(f"cost constants: hot_bytes ({self.hot_bytes}) must be below cold_bytes "
                                f"({self.cold_bytes})")

    @property
    def lookup_bw(self) -> float:
        """The forward's bandwidth for a large table (the old model's single figure)."""
        return self.lookup_bw_cold

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Dict[str, Any]) -> "CostConstants":
        names = {f.name for f in fields(CostConstants)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise PlanningError(f"cost constants: unknown fields {unknown}; valid: {sorted(names)}")
        fmt = d.get("format", FORMAT)
        if isinstance(fmt, bool) or fmt != FORMAT:
            raise PlanningError(f"cost constants: format {fmt!r} is not {FORMAT}")
        return replace(CostConstants(), **d)

    @staticmethod
    def from_json(path: str) -> "CostConstants":
        """The constants of a JSON file of fields; a bad one is refused naming the file."""
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise PlanningError(f"{path}: expected a JSON object")
        return _from_file(data, path)


def _from_file(fields_: Dict[str, Any], where: str) -> CostConstants:
    """:meth:`CostConstants.from_dict` of the fields read from ``where`` (a file, a part of one),
    its errors prefixed with ``where``."""
    try:
        return CostConstants.from_dict(fields_)
    except PlanningError as e:
        raise PlanningError(f"{where}: {e}") from None


# ----------------------------------------------------------------------------- built-in defaults
_H100 = CostConstants(
    device_kind="h100",
    source="built-in defaults for an H100 node (datasheet: HBM3 3.35 TB/s, random row gathers at about 50%; "
           "NVLink4 450 GB/s per direction; one 400 Gb/s NIC per GPU; dense bf16 at about a third of 990 "
           "TFLOP/s); not measured: run neo calibrate on the machine",
)
_H200 = replace(
    _H100, device_kind="h200", lookup_bw_hot=4.4e12, lookup_bw_cold=2.4e12, update_bw_hot=3.0e12,
    update_bw_cold=1.8e12, cold_bytes=3e9,
    source="built-in defaults for an H200 node (datasheet: HBM3e 4.8 TB/s, the rest as H100); not measured: "
           "run neo calibrate on the machine",
)
_CPU = CostConstants(
    device_kind="cpu",
    lookup_bag_s=13e-9, lookup_id_s=1.0e-9, lookup_bw_hot=660e9, lookup_bw_cold=40e9,
    update_id_s=3.8e-9, update_row_s=9.5e-9, update_bw_hot=170e9, update_bw_cold=26e9,
    hot_bytes=1 << 20, cold_bytes=2 << 30, kernel_overhead=5e-6, lookup_call_s=69e-6,
    intra_bw=8.3e9, inter_bw=1e9, intra_latency=10e-6, inter_latency=200e-6,
    input_dist_overhead=178e-6, output_dist_overhead=172e-6, row_wise_overhead=29e-9,
    column_wise_overhead=9.4e-9, data_parallel_overhead=20e-9, table_row_wise_overhead=43e-9,
    table_column_wise_overhead=26e-9,
    allreduce_bw=11e9, allreduce_latency=10e-6,
    dense_flops=107e9, dense_layer_s=54e-6, dense_elem_s=0.37e-9, interaction_flops=82e9,
    dense_optimizer_bw=43e9, data_batch_s=135e-6, data_bag_s=0.0, data_id_s=13e-9, pooled_elem_s=0.96e-9,
    step_overhead=405e-6,
    host_bw=3e9, cache_miss_latency=1.0e-6, cache_batch_s=0.3e-3, cache_access_s=0.2e-6,
    weighted_call_s=31e-6, weighted_feature_s=4.7e-6, weighted_bag_s=6.0e-9, weighted_id_s=3.7e-9,
    source="built-in defaults for the project's CI machine (a 2-core AMD EPYC VM with AVX-512): neo calibrate "
           "at 2 ranks x 1 thread on an AMD EPYC Zen 5 VM (26/2/1), 2026-12-05 13:15-13:18 UTC, the median of "
           "three runs, rounded (the sharding kinds' overheads too); the cache's terms: neo "
           "calibrate's cache measurement on an Intel Xeon (Emerald Rapids) VM, 2026-12-01 UTC; the AllReduce's "
           "terms, step_overhead and pooled_elem_s refitted at 2 ranks on the same Zen 5 VM, 2026-12-05 "
           "17:56-17:59 UTC (the median of four runs, rounded), once neo calibrate timed the trainer's "
           "shared-memory AllReduce instead of gloo's; the loader's terms from neo calibrate's loading "
           "measurement at 2 ranks on that VM, 2026-12-05 18:09-18:12 UTC (the median of six runs, rounded), "
           "once it could tell the cost per id from the cost per bag; the learnable per-id weights' terms "
           "from neo calibrate's weighted lookups in one process on that VM, 2026-12-05 23:32 UTC (the "
           "median of five runs, rounded); not measured on this machine: run neo calibrate",
)
# One process on a CPU: no collectives, so the distributions' bookkeeping is the one-rank paths'
# (InputDist.one_rank: the batch is the local batch). neo calibrate in one process (one thread) on
# the same VM, two runs on 2026-12-05: 36-38 and 19-21 us, against 178 and 172 at 2 ranks.
# (On 2026-12-01, with the constants before, the 2-rank overheads made the main job's prediction
# at one process 6.33 ms against 4.20 measured; docs/benchmarks.md, "Planner fidelity".)
_CPU_ONE_PROCESS = replace(
    _CPU, input_dist_overhead=37e-6, output_dist_overhead=20e-6,
    source=_CPU.source + "; at one process the distributions' overheads of neo calibrate in one process on "
                         "the same VM, 2026-12-05 UTC, rounded",
)


_BUILTIN = {"cpu": _CPU, "h100": _H100, "h200": _H200}


def builtin_constants(device_kind: str, world_size: Optional[int] = None) -> CostConstants:
    """The built-in defaults of a device kind (cpu, h100, h200), each naming its source; a CPU's
    at ``world_size`` 1 have the one-process overheads (no collectives, no other rank to wait for)."""
    if device_kind not in _BUILTIN:
        raise PlanningError(f"device kind {device_kind!r}: no built-in cost constants; have {list(_BUILTIN)}")
    if device_kind == "cpu" and world_size == 1:
        return _CPU_ONE_PROCESS
    return _BUILTIN[device_kind]


# ----------------------------------------------------------------------------- calibration files
def machine_key(machine: Dict[str, Any]) -> str:
    """A file-name-safe key of a machine: its device kind, CPU model, cores and GPU."""
    parts = [machine.get("device_kind", "cpu"), machine.get("cpu_model", "cpu"), f"{machine.get('cores', 0)}c"]
    if machine.get("gpu"):
        parts.append(machine["gpu"])
    return re.sub(r"[^a-z0-9]+", "-", "-".join(str(p) for p in parts).lower()).strip("-")


def calibration_path(machine: Dict[str, Any], cache_dir: Optional[str] = None) -> str:
    """Where ``neo calibrate`` keeps this machine's constants (``$XDG_CACHE_HOME/neo`` or ``~/.cache/neo``)."""
    root = cache_dir or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "neo")
    return os.path.join(root, f"calibration-{machine_key(machine)}.json")


def _pick(per_world: Dict[str, Any], world_size: int) -> Tuple[Dict[str, Any], int]:
    """The constants measured at ``world_size`` ranks, else at the nearest world size measured."""
    sizes = sorted(int(w) for w in per_world)
    best = min(sizes, key=lambda w: (abs(w - world_size), -w))
    return per_world[str(best)], best


def load_constants(path: str, world_size: int, device_kind: Optional[str] = None) -> CostConstants:
    """Constants of a file: a calibration (``{"format", "machine", "constants": {W: {...}}}``) or a
    flat mapping of fields. Raises :class:`PlanningError` naming the problem."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise PlanningError(f"{path}: expected a JSON object")
    if "constants" in data:
        fmt = data.get("format", 0)
        if isinstance(fmt, bool) or fmt != FORMAT:
            older = isinstance(fmt, (int, float)) and -math.inf < fmt < FORMAT
            raise PlanningError(f"{path}: calibration format {fmt!r} is {'older than' if older else 'not'} {FORMAT}")
        fields_, measured_at = _pick(data["constants"], world_size)
        c = _from_file(fields_, f"{path}: constants[{measured_at}]")
        if measured_at != world_size:
            warnings.warn(f"{path}: no constants measured at {world_size} ranks; using those of {measured_at}",
                          stacklevel=2)
    else:
        c = _from_file(data, path)
    if device_kind is not None and c.device_kind != device_kind:
        raise PlanningError(f"{path}: constants of a {c.device_kind} machine, this one is {device_kind}")
    return c


def _reason(e: Exception, path: str) -> str:
    """``e``'s message without the ``path: `` in front that :func:`load_constants` gives it."""
    msg = str(e)
    return msg[len(path) + 2:] if msg.startswith(f"{path}: ") else msg


def resolve_constants(explicit: Optional[str], machine: Dict[str, Any], world_size: int,
                      cache_dir: Optional[str] = None) -> Tuple[CostConstants, str]:
    """(constants, what they are) in the order of the module docstring. A named file that cannot
    be used is an error; an unusable calibration file of this machine is a warning."""
    kind = machine.get("device_kind", "cpu")
    if explicit:
        try:
            return load_constants(explicit, world_size), f"file {explicit}"
        except (OSError, ValueError) as e:
            raise PlanningError(f"sharding.cost_constants: cannot use {explicit!r}: {_reason(e, explicit)}") from None
    path = calibration_path(machine, cache_dir)
    if os.path.exists(path):
        try:
            c = load_constants(path, world_size, kind)
            return c, f"calibrated on this machine ({c.source}; {path})"
        except (OSError, ValueError) as e:
            warnings.warn(f"calibration file {path} not used ({_reason(e, path)}); built-in {kind} defaults instead",
                          stacklevel=2)
    c = builtin_constants(kind, world_size)
    return c, f"built-in {kind} defaults ({c.source})"
