"""The ``tables`` section of Neo's YAML config: one entry per embedding table.

An entry carries the embedding module's per-table fields (:class:`TableConfig`,
:class:`OptimizerConfig`), the planner's statistics (pooling factor, access skew) and the
sharding constraints. Choices are plain strings in YAML (``dtype: fp16``) validated
against the enums; errors name the field (``tables[3].dim``) and the valid values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

from neo.config.embedding import (CachePolicy, CacheStore, ConfigError, OptimizerConfig, choice, field_default,
                                  OptimizerType, Placement, PoolingMode, TableConfig, WeightDType)
from neo.config.topology import MAX_GIB

__all__ = ["OptimizerEntry", "TableEntry", "SHARDING_TYPES", "PLACEMENTS", "MAX_POOLING_FACTOR", "table_spec"]

SHARDING_TYPES = ("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise")
"""Valid ``sharding_types`` values (see docs/planner.md)."""
PLACEMENTS = ("auto", "device", "cached")
"""Valid ``placement`` values (``auto``: the planner decides)."""
MAX_POOLING_FACTOR = MAX_GIB * 2**30 / 8
"""Most mean ids per bag (2^59): one bag's 8-byte ids within the largest memory of a rank
(``MAX_GIB``). Beyond it the planner's byte counts overflow ("needs inf bytes")."""


@dataclass
class OptimizerEntry:
    """A table's fused sparse optimizer (see :class:`neo.config.embedding.OptimizerType`)."""

    type: str = "sgd"
    """Update rule: sgd, adagrad, rowwise_adagrad, adam or lamb."""
    lr: float = 0.01
    """Learning rate (>= 0)."""
    eps: float = 1e-8
    """Denominator epsilon of the adaptive optimizers."""
    beta1: float = 0.9
    """First-moment decay of adam and lamb, in [0, 1)."""
    beta2: float = 0.999
    """Second-moment decay of adam and lamb, in [0, 1)."""
    weight_decay: float = 0.0
    """L2 penalty (decoupled for lamb)."""
    initial_accumulator_value: float = 0.0
    """Starting sum of squares of adagrad and rowwise_adagrad."""

    def to_config(self, where: str = "optimizer") -> OptimizerConfig:
        t = choice(self.type, [m.value for m in OptimizerType], f"{where}.type")
        try:
            return OptimizerConfig(OptimizerType(t), self.lr, self.eps, self.beta1, self.beta2,
                                   self.weight_decay, self.initial_accumulator_value)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None


@dataclass
class TableEntry:
    """One embedding table of the ``tables`` list."""

    name: str = ""
    """Unique table name."""
    num_rows: int = 0
    """Rows (ids 0 .. num_rows - 1); > 0."""
    dim: int = 0
    """Embedding dimension; a positive multiple of 4."""
    feature_names: List[str] = field(default_factory=list)
    """Sparse features that read this table; empty = one feature named like the table."""
    pooling: str = "sum"
    """Bag reduction: sum or mean."""
    dtype: str = "fp32"
    """Weight storage: fp32, fp16 or bf16."""
    optimizer: OptimizerEntry = field(default_factory=OptimizerEntry)
    """Fused sparse optimizer."""
    stochastic_rounding: bool = True
    """Stochastic rounding of fp16/bf16 weight updates."""
    init_scale: Optional[float] = None
    """Initial weights uniform in [-s, s]; default 1 / sqrt(num_rows)."""
    pooling_factor: float = 1.0
    """Planner statistic: mean ids per sample per feature (> 0)."""
    access_skew: float = 0.0
    """Planner statistic: Zipf exponent of the ids (0 = uniform, ~1 typical); sets the cache
    hit rate of host placement."""
    sharding_types: List[str] = field(default_factory=list)
    """Allowed sharding types (empty = all): data_parallel, table_wise, row_wise, column_wise,
    table_row_wise, table_column_wise."""
    ranks: List[int] = field(default_factory=list)
    """Pinned ranks (empty = any); honoured by table_wise and column_wise only."""
    column_shard_width: Optional[int] = None
    """Width of column shards (positive multiple of 4, <= dim); null = planner's choice."""
    placement: str = "auto"
    """Where the rows live: device (all in fast memory), cached (a cache of hot rows in fast
    memory over a backing store: host memory under a GPU, a file on disk under a CPU), or auto
    (the planner chooses: device where memory allows, else cached with a cache size from the
    table's miss-ratio curve)."""
    cache_rows: Optional[int] = None
    """Cached tables: rows of the cache (or give cache_load_factor; null for both: the planner sizes it)."""
    cache_load_factor: Optional[float] = None
    """Cached tables: the cache's share of the table's rows, in (0, 1]."""
    cache_policy: str = "lookahead"
    """Cached tables: eviction policy, lru, lfu or lookahead (see docs/cache.md)."""
    cache_lookahead: int = 32
    """Cached tables, lookahead policy: future batches (after the prefetched one) it looks at."""
    cache_store: str = "auto"
    """Cached tables: backing store, auto (mmap on CPU, host on GPU), host or mmap."""
    cache_dir: Optional[str] = None
    """Cached tables on mmap: directory of the backing file (default: train.cache_store_dir)."""
    cache_store_resident_gib: float = 2.0
    """Cached tables on mmap: file pages kept mapped in the process before they are released."""

    def validate(self, where: str = "table") -> None:
        """Raise :class:`ConfigError` naming the field (``where.field``) and the valid values."""
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"{where}.name: must be a non-empty string, got {self.name!r}")
        if self.num_rows <= 0:
            raise ConfigError(f"{where}.num_rows: must be a positive integer, got {self.num_rows!r}")
        if self.dim <= 0 or self.dim % 4:
            raise ConfigError(f"{where}.dim: must be a positive multiple of 4, got {self.dim!r}")
        choice(self.pooling, [m.value for m in PoolingMode], f"{where}.pooling")
        choice(self.dtype, [m.value for m in WeightDType], f"{where}.dtype")
        if not (self.pooling_factor > 0 and math.isfinite(self.pooling_factor)):
            raise ConfigError(f"{where}.pooling_factor: must be a finite number > 0, got {self.pooling_factor!r}")
        if self.pooling_factor > MAX_POOLING_FACTOR:
            raise ConfigError(f"{where}.pooling_factor: must be a finite number > 0 and <= {MAX_POOLING_FACTOR:g} "
                              f"(mean ids per bag: a bag's 8-byte ids within a rank's largest memory, "
                              f"{MAX_GIB:.0f} GiB), got {self.pooling_factor!r}")
        if not (self.access_skew >= 0 and math.isfinite(self.access_skew)):
            raise ConfigError(f"{where}.access_skew: must be a finite number >= 0 (Zipf exponent), "
                              f"got {self.access_skew!r}")
        for k, s in enumerate(self.sharding_types):
            choice(s, SHARDING_TYPES, f"{where}.sharding_types[{k}]")
        for k, r in enumerate(self.ranks):
            if r < 0:
                raise ConfigError(f"{where}.ranks[{k}]: must be >= 0, got {r!r}")
        w = self.column_shard_width
        if w is not None and (w <= 0 or w % 4 or w > self.dim):
            raise ConfigError(f"{where}.column_shard_width: must be a positive multiple of 4 and <= dim "
                              f"({self.dim}), got {w!r}")
        choice(self.placement, PLACEMENTS, f"{where}.placement")
        choice(self.cache_policy, [m.value for m in CachePolicy], f"{where}.cache_policy")
        choice(self.cache_store, [m.value for m in CacheStore], f"{where}.cache_store")
        if self.placement.lower() != "cached" and (self.cache_rows is not None or self.cache_load_factor is not None):
            raise ConfigError(f"{where}.cache_rows / cache_load_factor: set, but placement is "
                              f"{self.placement!r} (set placement: cached)")
        if self.placement.lower() == "device":       # (auto: the planner may cache it, with these settings)
            given = [n for n in ("cache_policy", "cache_lookahead", "cache_store", "cache_dir",
                                 "cache_store_resident_gib") if getattr(self, n) != field_default(type(self), n)]
            if given:
                raise ConfigError(f"{where}.{given[0]}: set, but placement is 'device' (set placement: cached or "
                                  f"auto, or leave the cache fields out)")
        top = WeightDType(choice(self.dtype, [m.value for m in WeightDType], f"{where}.dtype")).max_value
        if self.init_scale is not None and not 0 < self.init_scale <= top:
            raise ConfigError(f"{where}.init_scale: must be null or a number in (0, {top:g}] (weights start uniform "
                              f"in [-init_scale, init_scale] in the table's dtype), got {self.init_scale!r}")
        self.to_table_config(where)

    def to_table_config(self, where: str = "table") -> TableConfig:
        """The embedding module's :class:`TableConfig` of this entry."""
        opt = self.optimizer.to_config(f"{where}.optimizer")
        try:
            return TableConfig(self.name, int(self.num_rows), int(self.dim), tuple(self.feature_names),
                               PoolingMode(choice(self.pooling, [m.value for m in PoolingMode], f"{where}.pooling")),
                               WeightDType(choice(self.dtype, [m.value for m in WeightDType], f"{where}.dtype")),
                               opt, bool(self.stochastic_rounding), self.init_scale,
                               placement=Placement.CACHED if self.placement.lower() == "cached" else Placement.DEVICE,
                               cache_rows=self.cache_rows, cache_load_factor=self.cache_load_factor,
                               cache_policy=self.cache_policy.lower(), cache_lookahead=int(self.cache_lookahead),
                               cache_store=self.cache_store.lower(), cache_dir=self.cache_dir,
                               cache_store_resident_gib=float(self.cache_store_resident_gib))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    def to_table_spec(self, where: str = "table"):
        """The planner's :class:`neo.planner.TableSpec` (statistics and constraints included)."""
        from neo.planner.types import Placement, ShardingType, TableConstraints

        tc = self.to_table_config(where)
        cons = TableConstraints(tuple(ShardingType(s.lower()) for s in self.sharding_types),
                                tuple(int(r) for r in self.ranks), self.column_shard_width,
                                Placement(self.placement.lower()))
        fraction = None
        if self.cache_rows is not None:
            fraction = self.cache_rows / tc.num_rows
        elif self.cache_load_factor is not None:
            fraction = float(self.cache_load_factor)
        return table_spec(tc, float(self.pooling_factor), float(self.access_skew), cons, cache_fraction=fraction)


def table_spec(tc: TableConfig, pooling_factor: float = 1.0, access_skew: float = 0.0, constraints=None,
               cache_fraction: Optional[float] = None):
    """The planner's :class:`neo.planner.TableSpec` of an embedding table: its storage bytes and the
    optimizer state training keeps (per element or per row), with the given statistics and
    :class:`neo.planner.TableConstraints` (None: none)."""
    from neo.planner.types import TableConstraints, TableSpec

    opt = tc.optimizer.type
    return TableSpec(tc.name, tc.num_rows, tc.dim, tc.dtype.itemsize, opt.state_floats_per_row(tc.dim),
                     not opt.rowwise_state and bool(opt.state_names()), len(tc.feature_names),
                     float(pooling_factor), float(access_skew), constraints or TableConstraints(),
                     cache_fraction=cache_fraction, cache_policy=tc.cache_policy.value,
                     cache_lookahead=int(tc.cache_lookahead))
