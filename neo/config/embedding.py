"""Typed configuration of embedding tables and their fused sparse optimizers.

These dataclasses are what library code receives (never a raw dict). Each validates
itself on construction and names the field and the valid values when it is wrong.
"""

from __future__ import annotations

import enum
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

if TYPE_CHECKING:                      # torch is imported where a dtype is needed: `neo plan` never loads it
    import torch

__all__ = ["choice", "field_default", "PoolingMode", "WeightDType", "OptimizerType", "OptimizerConfig", "TableConfig", "ConfigError",
           "Placement", "CachePolicy", "CacheStore", "DEFAULT_CACHE_LOAD_FACTOR"]


class ConfigError(ValueError):
    """A configuration value that is invalid; the message names the field."""


def choice(value, valid: Sequence[str], where: str) -> str:
    """``value`` lower-cased if it is one of ``valid``; else a :class:`ConfigError` naming field and choices."""
    v = str(value).lower()
    if v not in valid:
        raise ConfigError(f"{where}: {value!r} is not one of {list(valid)}")
    return v


def field_default(cls, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name`` (a fresh value from its factory for a list
    or a mapping): what "left unset" means when a check asks whether a field was set."""
    f = next(f for f in fields(cls) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default


def _enum(cls, value, where: str):
    if isinstance(value, cls):
        return value
    return cls(choice(value, [m.value for m in cls], where))


class PoolingMode(str, enum.Enum):
    """How the rows of one bag are reduced to one vector: ``sum``, or ``mean`` (the sum over the
    bag's id count; an empty bag gives zeros). With per-id weights, ``mean`` is the weighted sum
    over the id count (not over the weights' sum); torch's ``embedding_bag`` refuses weights with
    ``mode="mean"``, FBGEMM's and TorchRec's weighted bags are sums."""

    SUM = "sum"
    MEAN = "mean"


class WeightDType(str, enum.Enum):
    """Storage type of a table's weights (optimizer state is always fp32)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.value]

    @property
    def itemsize(self) -> int:
        return 4 if self is WeightDType.FP32 else 2

    @property
    def max_value(self) -> float:
        """The largest finite value the type holds: (2 - 2^-m) 2^e_max for m fraction bits and the
        largest exponent e_max (``torch.finfo(torch_dtype).max``, without importing torch: a
        config's validation, and so ``neo plan``, runs without it)."""
        fraction_bits, e_max = {"fp32": (23, 127), "fp16": (10, 15), "bf16": (7, 127)}[self.value]
        return (2.0 - 2.0 ** -fraction_bits) * 2.0 ** e_max


class OptimizerType(str, enum.Enum):
    """Sparse optimizers fused into the embedding backward pass.

    Update rules, for a row ``w`` whose aggregated gradient in this step is ``g``
    (sum over every occurrence of the row in the batch), at global step ``t`` (1-based):

    - ``sgd``: ``w -= lr * g``
    - ``adagrad``: ``s += g*g; w -= lr * g / (sqrt(s) + eps)`` (torch.optim.Adagrad)
    - ``rowwise_adagrad``: ``s_row += mean(g*g); w -= lr * g / (sqrt(s_row) + eps)``
      (one state value per row, as FBGEMM's EXACT_ROWWISE_ADAGRAD)
    - ``adam``: ``m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
      w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)`` (torch.optim.Adam on the touched rows)
    - ``lamb``: the Adam direction ``u = m_hat / (sqrt(v_hat) + eps) + wd * w`` scaled by the
      row's trust ratio ``||w|| / ||u||`` (1 where either norm is 0): ``w -= lr * ratio * u``

    Weight decay (``weight_decay > 0``) is L2 added to the gradient (``g += wd * w``) for
    sgd, adagrad, rowwise_adagrad and adam, as torch.optim does, and decoupled (inside
    ``u``) for lamb. It applies to rows present in the batch only: rows a step does not
    touch are not read or written (that is what makes the update sparse).
    """

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"
    ADAM = "adam"
    LAMB = "lamb"

    def state_names(self) -> Tuple[str, ...]:
        """Names of the optimizer state tensors, each stored like the weights (or per row)."""
        return {
            OptimizerType.SGD: (),
            OptimizerType.ADAGRAD: ("sum",),
            OptimizerType.ROWWISE_ADAGRAD: ("sum",),
            OptimizerType.ADAM: ("exp_avg", "exp_avg_sq"),
            OptimizerType.LAMB: ("exp_avg", "exp_avg_sq"),
        }[self]

    @property
    def rowwise_state(self) -> bool:
        """True where the state is one value per row rather than one per element."""
        return self is OptimizerType.ROWWISE_ADAGRAD

    def state_floats_per_row(self, dim: int) -> int:
        """fp32 values of optimizer state kept per row of dimension ``dim``."""
        n = len(self.state_names())
        return n if self.rowwise_state else n * dim


class Placement(str, enum.Enum):
    """Where a table's rows live during training."""

    DEVICE = "device"
    """Every row in the fast memory of its rank (HBM on a GPU, DRAM on a CPU)."""
    CACHED = "cached"
    """A cache of hot rows in fast memory over a backing store holding every row (pinned host
    memory under a GPU cache, a memory-mapped file on disk under a DRAM cache); see docs/cache.md."""


class CachePolicy(str, enum.Enum):
    """Which cached rows make room for missing ones (docs/cache.md)."""

    LRU = "lru"
    """Least recently used."""
    LFU = "lfu"
    """Least frequently used (counts kept for every row of the table), ties by recency."""
    LOOKAHEAD = "lookahead"
    """Belady's rule within the pipeline's window: rows no batch of the next ``cache_lookahead``
    uses go first (least frequently used first), then the row needed farthest ahead."""


class CacheStore(str, enum.Enum):
    """The backing store of a cached table."""

    AUTO = "auto"
    """``mmap`` when the cache is in CPU memory, ``host`` when it is on a GPU."""
    HOST = "host"
    """Host memory (pinned when a GPU reads it)."""
    MMAP = "mmap"
    """A memory-mapped file on disk (tables larger than RAM)."""


DEFAULT_CACHE_LOAD_FACTOR = 0.2
"""Cache size of a cached table that gives neither ``cache_rows`` nor ``cache_load_factor``."""


def _is_int(v) -> bool:
    """An integer, not a bool (``True`` is an int to Python, never a size here)."""
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class OptimizerConfig:
    """Hyper-parameters of a fused sparse optimizer."""

    type: OptimizerType = OptimizerType.SGD
    """Which update rule; see :class:`OptimizerType`."""
    lr: float = 0.01
    """Learning rate."""
    eps: float = 1e-8
    """Added to the denominator of adaptive optimizers (adagrad, rowwise_adagrad, adam, lamb)."""
    beta1: float = 0.9
    """First-moment decay of adam and lamb."""
    beta2: float = 0.999
    """Second-moment decay of adam and lamb."""
    weight_decay: float = 0.0
    """L2 penalty (decoupled for lamb); see :class:`OptimizerType`."""
    initial_accumulator_value: float = 0.0
    """Starting value of adagrad's and rowwise_adagrad's sum of squares."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", _enum(OptimizerType, self.type, "optimizer.type"))
        for name in ("lr", "eps", "weight_decay", "initial_accumulator_value"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"optimizer.{name} must be a finite number >= 0, got {v!r}")
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ConfigError(f"optimizer.{name} must be in [0, 1), got {v!r}")


@dataclass(frozen=True)
class TableConfig:
    """One embedding table."""

    name: str
    """Unique table name; appears in every error about the table."""
    num_rows: int
    """Rows (ids 0 .. num_rows - 1 are valid)."""
    dim: int
    """Embedding dimension D; any positive multiple of 4."""
    feature_names: Tuple[str, ...] = ()
    """Sparse features that look this table up; defaults to one feature named like the table."""
    pooling: PoolingMode = PoolingMode.SUM
    """How a bag's rows are reduced: sum or mean."""
    dtype: WeightDType = WeightDType.FP32
    """Weight storage: fp32, fp16 or bf16."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Fused sparse optimizer of this table."""
    stochastic_rounding: bool = True
    """Round fp16/bf16 weights stochastically when the optimizer writes them (unbiased)."""
    init_scale: Optional[float] = None
    """Weights start uniform in [-s, s]; default s = 1 / sqrt(num_rows)."""
    placement: Placement = Placement.DEVICE
    """``device`` (every row in fast memory) or ``cached`` (a cache over a backing store)."""
    cache_rows: Optional[int] = None
    """Cached tables: rows the cache holds (at most num_rows); or give ``cache_load_factor``."""
    cache_load_factor: Optional[float] = None
    """Cached tables: the cache's share of the rows, in (0, 1]; default 0.2 when neither is given."""
    cache_policy: CachePolicy = CachePolicy.LOOKAHEAD
    """Cached tables: eviction policy, lru, lfu or lookahead."""
    cache_lookahead: int = 32
    """Cached tables with the lookahead policy: batches beyond the prefetched one whose ids it sees."""
    cache_store: CacheStore = CacheStore.AUTO
    """Cached tables: backing store, auto, host or mmap."""
    cache_dir: Optional[str] = None
    """Cached tables on ``mmap``: directory of the backing file (default: the module's ``store_dir``)."""
    cache_store_resident_gib: float = 2.0
    """Cached tables on ``mmap``: file pages the store keeps mapped in the process before releasing
    them (bounds resident memory; lower trades speed for memory)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"table.name must be a non-empty string, got {self.name!r}")
        where = f"table '{self.name}'"
        if not _is_int(self.num_rows) or self.num_rows <= 0:
            raise ConfigError(f"{where}: num_rows must be a positive integer, got {self.num_rows!r}")
        if not _is_int(self.dim) or self.dim <= 0 or self.dim % 4:
            raise ConfigError(f"{where}: dim must be a positive multiple of 4, got {self.dim!r}")
        if isinstance(self.feature_names, str):
            raise ConfigError(f"{where}: feature_names must be a sequence of names, got the string "
                              f"{self.feature_names!r} (write ({self.feature_names!r},))")
        feats = tuple(self.feature_names) or (self.name,)
        if not all(isinstance(f, str) and f for f in feats):
            raise ConfigError(f"{where}: feature_names must be non-empty strings, got {list(feats)}")
        if len(set(feats)) != len(feats):
            raise ConfigError(f"{where}: feature_names repeat: {list(feats)}")
        object.__setattr__(self, "feature_names", feats)
        object.__setattr__(self, "pooling", _enum(PoolingMode, self.pooling, f"{where}: pooling"))
        object.__setattr__(self, "dtype", _enum(WeightDType, self.dtype, f"{where}: dtype"))
        if not isinstance(self.stochastic_rounding, bool):
            raise ConfigError(f"{where}: stochastic_rounding must be true or false, got {self.stochastic_rounding!r}")
        s = self.init_scale
        if s is not None and (not isinstance(s, (int, float)) or isinstance(s, bool)
                              or not 0 < s <= self.dtype.max_value):
            raise ConfigError(f"{where}: init_scale must be null or a number in (0, {self.dtype.max_value:g}] (weights "
                              f"start uniform in [-init_scale, init_scale] in {self.dtype.value}), got {s!r}")
        if not isinstance(self.optimizer, OptimizerConfig):
            raise ConfigError(f"{where}: optimizer must be an OptimizerConfig, got {type(self.optimizer).__name__}")
        object.__setattr__(self, "placement", _enum(Placement, self.placement, f"{where}: placement"))
        object.__setattr__(self, "cache_policy", _enum(CachePolicy, self.cache_policy, f"{where}: cache_policy"))
        object.__setattr__(self, "cache_store", _enum(CacheStore, self.cache_store, f"{where}: cache_store"))
        self._check_cache(where)

    def _check_cache(self, where: str) -> None:
        rows, factor = self.cache_rows, self.cache_load_factor
        if self.placement is Placement.DEVICE:
            if rows is not None or factor is not None:
                raise ConfigError(f"{where}: cache_rows / cache_load_factor are set but placement is 'device' "
                                  "(set placement: cached)")
            return
        if rows is not None and factor is not None:
            raise ConfigError(f"{where}: give cache_rows ({rows}) or cache_load_factor ({factor}), not both")
        if rows is not None and (not isinstance(rows, int) or not 0 < rows <= self.num_rows):
            raise ConfigError(f"{where}: cache_rows must be an integer in [1, num_rows={self.num_rows}], got {rows!r}")
        if factor is not None and (not isinstance(factor, (int, float)) or not 0 < factor <= 1):
            raise ConfigError(f"{where}: cache_load_factor must be in (0, 1], got {factor!r}")
        if not isinstance(self.cache_store_resident_gib, (int, float)) or not self.cache_store_resident_gib > 0:
            raise ConfigError(f"{where}: cache_store_resident_gib must be > 0, got {self.cache_store_resident_gib!r}")
        if not isinstance(self.cache_lookahead, int) or not 0 <= self.cache_lookahead <= 62:
            raise ConfigError(f"{where}: cache_lookahead must be an integer in [0, 62], got {self.cache_lookahead!r}")

    @property
    def cached(self) -> bool:
        return self.placement is Placement.CACHED

    @property
    def cache_capacity(self) -> int:
        """Rows of fast memory this table occupies: num_rows on the device, the cache's size when cached."""
        if not self.cached:
            return self.num_rows
        if self.cache_rows is not None:
            return self.cache_rows
        factor = self.cache_load_factor if self.cache_load_factor is not None else DEFAULT_CACHE_LOAD_FACTOR
        return max(1, min(self.num_rows, math.ceil(factor * self.num_rows)))
