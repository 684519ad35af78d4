"""Inputs of the sharding planner: topology, tables, constraints, cost constants, shards.

Pure Python (no torch, no process group). Every class is an immutable dataclass; the
planner stages return new objects and never mutate their inputs.

Design after TorchRec's planner (``torchrec/distributed/planner/types.py``:
``Topology``, ``ParameterConstraints``, ``ShardingOption``) and the Neo paper
(Mudigere et al., "Software-Hardware Co-design for Fast and Scalable Training of Deep
Learning Recommendation Models", ISCA 2022), written from scratch.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

from neo.planner.cache_model import POLICIES

__all__ = [
    "ShardingType",
    "Placement",
    "PlanningError",
    "Device",
    "Topology",
    "TableConstraints",
    "TableSpec",
    "Shard",
    "GIB",
]

GIB = 1024**3
MAX_GIB = float(2**32)
"""Most memory per rank :meth:`Topology.uniform` takes, GiB (bytes still fit 64 bits)."""


class PlanningError(ValueError):
    """A table cannot be placed; the message names the table, the constraint or the
    memory missing, and how much."""


class ShardingType(str, enum.Enum):
    """How one table is split (see docs/planner.md for the exact shard semantics)."""

    DATA_PARALLEL = "data_parallel"
    """A full replica on every rank; gradients are AllReduced."""
    TABLE_WISE = "table_wise"
    """One shard (all rows, all columns) on one rank."""
    ROW_WISE = "row_wise"
    """Contiguous row ranges on ALL ranks (W shards, sizes differ by at most one row)."""
    COLUMN_WISE = "column_wise"
    """Column slices of ``column_shard_width`` (multiple of 4), each placed on some rank."""
    TABLE_ROW_WISE = "table_row_wise"
    """Contiguous row ranges on the ``local_world_size`` ranks of ONE node."""
    TABLE_COLUMN_WISE = "table_column_wise"
    """Column slices, all placed on the ranks of ONE node."""

    @property
    def splits_rows(self) -> bool:
        return self in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)

    @property
    def splits_cols(self) -> bool:
        return self in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE)

    @property
    def within_node(self) -> bool:
        return self in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE)

    @property
    def output_group(self) -> int:
        """The output distribution of a table of this type (table_wise and column_wise share one
        AlltoAll); a rank's slots are ordered by it (neo/distributed/slots.py)."""
        return _OUTPUT_GROUP[self.value]


_OUTPUT_GROUP = {"table_wise": 0, "column_wise": 0, "row_wise": 1, "table_row_wise": 2, "table_column_wise": 3,
                 "data_parallel": 4}


class Placement(str, enum.Enum):
    """Where a table's rows live (docs/cache.md)."""

    DEVICE = "device"
    """Every row in the device's fast memory (HBM; DRAM on a CPU)."""
    CACHED = "cached"
    """A cache of hot rows in fast memory over a backing store (host memory, or a file on disk)
    holding every row; the planner sizes the cache from the table's miss-ratio curve."""
    AUTO = "auto"
    """A constraint only: the planner chooses device or cached (device where memory allows)."""


@dataclass(frozen=True)
class Device:
    """One rank's accelerator."""

    hbm_bytes: int = 80 * GIB
    """Device memory available to embeddings (weights, optimizer state, buffers, cache)."""
    host_bytes: int = 256 * GIB
    """Host memory available to this rank's host-placed (UVM) tables."""
    speed: float = 1.0
    """Relative speed (1.0 = the CostConstants' reference device); lookup time is divided by it."""

    def __post_init__(self) -> None:
        for name in ("hbm_bytes", "host_bytes"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise PlanningError(f"device: {name} must be an integer >= 0, got {v!r}")
            object.__setattr__(self, name, int(v))
        if not _is_real(self.speed) or not (math.isfinite(self.speed) and self.speed > 0):
            raise PlanningError(f"device: speed must be a finite number > 0, got {self.speed!r}")
        object.__setattr__(self, "speed", float(self.speed))


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


@dataclass(frozen=True)
class Topology:
    """Ranks numbered node-major: ``rank = node * local_world_size + local``."""

    world_size: int
    local_world_size: int
    devices: Tuple[Device, ...] = ()
    """One per rank; empty means ``world_size`` default devices."""
    batch_size_per_rank: int = 512
    """Samples per rank per step (global batch = world_size x this)."""

    def __post_init__(self) -> None:
        for name in ("world_size", "local_world_size", "batch_size_per_rank"):
            v = getattr(self, name)
            if not _is_int(v):
                raise PlanningError(f"topology: {name} must be an integer, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.world_size <= 0 or self.local_world_size <= 0:
            raise PlanningError(f"topology: world_size and local_world_size must be > 0, got "
                                f"{self.world_size}, {self.local_world_size}")
        if self.world_size % self.local_world_size:
            raise PlanningError(f"topology: world_size {self.world_size} is not a multiple of "
                                f"local_world_size {self.local_world_size}")
        devs = tuple(self.devices) or tuple(Device() for _ in range(self.world_size))
        if len(devs) != self.world_size:
            raise PlanningError(f"topology: {len(devs)} devices given for world_size {self.world_size}")
        bad = [k for k, d in enumerate(devs) if not isinstance(d, Device)]
        if bad:
            raise PlanningError(f"topology: devices[{bad[0]}] is a {type(devs[bad[0]]).__name__}, not a Device")
        if self.batch_size_per_rank <= 0:
            raise PlanningError(f"topology: batch_size_per_rank must be > 0, got {self.batch_size_per_rank}")
        object.__setattr__(self, "devices", devs)

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size

    def node_of(self, rank: int) -> int:
        return rank // self.local_world_size

    def node_ranks(self, node: int) -> range:
        lws = self.local_world_size
        return range(node * lws, (node + 1) * lws)

    @staticmethod
    def uniform(world_size: int, local_world_size: int, hbm_gib: float = 80.0, host_gib: float = 256.0,
                speed: float = 1.0, batch_size_per_rank: int = 512) -> "Topology":
        """``world_size`` identical devices: ``hbm_gib`` finite, > 0, ``host_gib`` finite, >= 0
        (both at most :data:`MAX_GIB`), ``speed`` finite, > 0; else a :class:`PlanningError`."""
        for name, v, zero_ok in (("hbm_gib", hbm_gib, False), ("host_gib", host_gib, True)):
            if not _is_real(v) or not (math.isfinite(v) and (v >= 0 if zero_ok else v > 0) and v <= MAX_GIB):
                raise PlanningError(f"topology: {name} must be a finite number {'>= 0' if zero_ok else '> 0'} "
                                    f"and <= {MAX_GIB:.0f}, got {v!r}")
        dev = Device(int(hbm_gib * GIB), int(host_gib * GIB), speed)
        return Topology(world_size, local_world_size, tuple(dev for _ in range(world_size)), batch_size_per_rank)


@dataclass(frozen=True)
class TableConstraints:
    """User constraints of one table (after TorchRec's ``ParameterConstraints``)."""

    sharding_types: Tuple[ShardingType, ...] = ()
    """Allowed sharding types; empty = all."""
    ranks: Tuple[int, ...] = ()
    """Pinned ranks: the table's shards may only live on these ranks (empty = any).
    Only table_wise and column_wise honour a pin (the others' ranks are fixed by the type)."""
    column_shard_width: Optional[int] = None
    """Width of column shards (multiple of 4) for column_wise / table_column_wise; None = planner's choice."""
    placement: Placement = Placement.DEVICE
    """device, cached, or auto (the planner chooses)."""

    def __post_init__(self) -> None:
        try:
            types = tuple(ShardingType(str(getattr(s, "value", s)).lower()) for s in self.sharding_types)
        except ValueError:
            raise PlanningError(f"sharding_types {list(self.sharding_types)}: valid values are "
                                f"{[m.value for m in ShardingType]}") from None
        try:
            placement = Placement(str(getattr(self.placement, "value", self.placement)).lower())
        except ValueError:
            raise PlanningError(f"placement {self.placement!r}: valid values are {[m.value for m in Placement]}") from None
        object.__setattr__(self, "sharding_types", types)
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        object.__setattr__(self, "placement", placement)


@dataclass(frozen=True)
class TableSpec:
    """What the planner needs to know about one embedding table."""

    name: str
    rows: int
    dim: int
    weight_bytes: int = 4
    """Bytes per weight element (4 fp32, 2 fp16/bf16)."""
    state_floats_per_row: int = 0
    """fp32 optimizer state values per row (0 sgd, 1 rowwise_adagrad, D adagrad, 2D adam)."""
    state_per_element: bool = False
    """True when the state scales with the columns (adagrad, adam): a column shard keeps its share."""
    num_features: int = 1
    """Features reading the table (each produces one pooled output per sample)."""
    pooling_factor: float = 1.0
    """Mean ids per sample per feature."""
    access_skew: float = 0.0
    """Zipf exponent of the id distribution (0 = uniform): the built-in miss-ratio model of a cached table."""
    constraints: TableConstraints = field(default_factory=TableConstraints)
    cache_fraction: Optional[float] = None
    """Cached tables: the cache's share of the rows, in (0, 1], when the user fixed it (None, not 0: the
    planner sizes it)."""
    hit_curve: Tuple[Tuple[float, float], ...] = ()
    """Measured (cache share of the rows, hit rate of a batch's distinct rows) points; empty: the skew model."""
    distinct_per_batch: Optional[float] = None
    """Measured distinct rows per global batch (with ``hit_curve``); None: the skew model."""
    cache_policy: str = "lookahead"
    """Cached tables: the cache's eviction policy (``lfu``, ``lru``, ``lookahead``), for the skew model."""
    cache_lookahead: int = 32
    """Cached tables: the lookahead policy's window, in batches."""
    weighted_features: int = 0
    """Features of the table whose ids carry per-id weights (a weighted batch, position weights):
    each of their ids travels with 4 bytes more (its weight, or its slot in a weight table)."""
    learnable_weights: bool = False
    """The weights require grad (position weights): their read and gradient cost the
    ``weighted_*`` constants (:mod:`neo.planner.cost`)."""

    def __post_init__(self) -> None:
        """Types and ranges of every field, as the config checks them; a :class:`PlanningError`
        naming the table and the field. (rows > 0 and dim a positive multiple of 4 are checked
        when the table is planned, with its constraints.)"""
        def bad(name: str, want: str, v) -> PlanningError:
            return PlanningError(f"table {self.name!r}: {name} must be {want}, got {v!r}")

        for name, low in (("rows", None), ("dim", None), ("weight_bytes", 1), ("state_floats_per_row", 0),
                          ("num_features", 1)):
            v = getattr(self, name)
            if not _is_int(v) or (low is not None and v < low):
                raise bad(name, "an integer" + ("" if low is None else f" >= {low}"), v)
            object.__setattr__(self, name, int(v))
        for name, positive in (("pooling_factor", True), ("access_skew", False)):
            v = getattr(self, name)
            if not _is_real(v) or not (math.isfinite(v) and (v > 0 if positive else v >= 0)):
                raise bad(name, f"a finite number {'> 0' if positive else '>= 0'}", v)
            object.__setattr__(self, name, float(v))
        f = self.cache_fraction
        if f is not None:   # None: the planner sizes the cache; a fixed share is a share of the rows
            if not _is_real(f) or not 0 < f <= 1:
                raise bad("cache_fraction", "a number in (0, 1] (the cache's share of the rows) or None", f)
            object.__setattr__(self, "cache_fraction", float(f))
        d = self.distinct_per_batch
        if d is not None:
            if not _is_real(d) or not (math.isfinite(d) and d >= 0):
                raise bad("distinct_per_batch", "a finite number >= 0 or None", d)
            object.__setattr__(self, "distinct_per_batch", float(d))
        try:
            curve = tuple((float(a), float(b)) for a, b in self.hit_curve)
        except (TypeError, ValueError):
            raise bad("hit_curve", "(cache share, hit rate) pairs", self.hit_curve) from None
        if any(not (0 <= a <= 1 and 0 <= b <= 1) for a, b in curve):
            raise bad("hit_curve", "(cache share, hit rate) pairs, both in [0, 1]", self.hit_curve)
        object.__setattr__(self, "hit_curve", curve)
        if not isinstance(self.constraints, TableConstraints):
            raise bad("constraints", "a TableConstraints", self.constraints)
        if self.cache_policy not in POLICIES:
            raise bad("cache_policy", f"one of {', '.join(POLICIES)}", self.cache_policy)
        if not _is_int(self.cache_lookahead) or self.cache_lookahead < 0:
            raise bad("cache_lookahead", "an integer >= 0", self.cache_lookahead)
        object.__setattr__(self, "cache_lookahead", int(self.cache_lookahead))
        if not _is_int(self.weighted_features) or not 0 <= self.weighted_features <= self.num_features:
            raise bad("weighted_features", f"an integer in [0, num_features = {self.num_features}]",
                      self.weighted_features)
        object.__setattr__(self, "weighted_features", int(self.weighted_features))
        if not isinstance(self.learnable_weights, bool):
            raise bad("learnable_weights", "a bool", self.learnable_weights)
        if self.learnable_weights and not self.weighted_features:
            raise bad("learnable_weights", "False where no feature is weighted (weighted_features 0)",
                      self.learnable_weights)

    @property
    def weighted_share(self) -> float:
        """Share of the table's features whose ids carry per-id weights."""
        return self.weighted_features / self.num_features

    def state_floats(self, cols: int) -> int:
        """Optimizer state floats per row for a shard of ``cols`` columns."""
        if self.state_per_element and self.dim:
            return self.state_floats_per_row * cols // self.dim
        return self.state_floats_per_row

    def bytes_per_row(self, cols: int) -> int:
        return cols * self.weight_bytes + 4 * self.state_floats(cols)


@dataclass(frozen=True)
class Shard:
    """A block of a table: rows ``[row_offset, row_offset+rows)`` x cols ``[col_offset, col_offset+cols)`` on ``rank``."""

    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int


def tiling_error(rows: int, dim: int, shards: Sequence[Shard]) -> Optional[str]:
    """Why the shards do not tile a ``rows x dim`` table exactly (an overlap or a gap), or None."""
    blocks = sorted((s.row_offset, s.col_offset, s.rows, s.cols) for s in shards if s.rows and s.cols)
    for i, a in enumerate(blocks):                # pairwise disjointness: shards per table are few
        for b in blocks[i + 1:]:
            if a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]:
                return f"shards overlap: (row_offset, col_offset, rows, cols) {a} and {b}"
    area = sum(b[2] * b[3] for b in blocks)
    if area != rows * dim:
        return f"shards cover {area} of the table's {rows} x {dim} = {rows * dim} cells (gap)"
    return None


def check_shards_tile(table: TableSpec, sharding_type: ShardingType, shards: Sequence[Shard], world_size: int) -> None:
    """Raise AssertionError unless the shards tile rows x cols exactly (DP: one full shard per rank)."""
    if sharding_type is ShardingType.DATA_PARALLEL:
        assert sorted(s.rank for s in shards) == list(range(world_size)), table.name
        assert all((s.row_offset, s.rows, s.col_offset, s.cols) == (0, table.rows, 0, table.dim) for s in shards)
        return
    for s in shards:
        assert 0 <= s.rank < world_size, (table.name, s)
        assert s.cols % 4 == 0 and s.cols > 0, (table.name, s)
        assert 0 <= s.row_offset and s.row_offset + s.rows <= table.rows, (table.name, s)
        assert 0 <= s.col_offset and s.col_offset + s.cols <= table.dim, (table.name, s)
    err = tiling_error(table.rows, table.dim, shards)
    assert err is None, (table.name, err)
