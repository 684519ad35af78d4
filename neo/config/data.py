"""The ``data`` section of Neo's YAML config: synthetic data (generated once, cached) or Parquet.

Synthetic (``source: synthetic``): ``data_pipeline.synthetic`` with a planted teacher writes
``num_samples + val_samples`` samples into ``cache_dir/<key>/`` where ``<key>`` hashes every
generator option (so a changed option generates a new set, an unchanged one is reused). Table
sizes come from the ``tables`` section (one feature per table, in table order); the last
``val_samples`` samples are the validation set. The generator reports the best achievable AUC.

Parquet (``source: parquet``): ``train_paths`` / ``val_paths`` (directories or files) written
by ``neo-data``. Features are matched to the tables' ``feature_names`` by name, or by position
when the names differ (Criteo's ``cat_0 .. cat_25``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List

from neo.config.embedding import ConfigError, choice

__all__ = ["DataSource", "SyntheticDataConfig", "DataConfig"]


class DataSource(str, enum.Enum):
    SYNTHETIC = "synthetic"
    PARQUET = "parquet"


@dataclass
class SyntheticDataConfig:
    """Options of the generated data set (see docs/data_pipeline.md, "Synthetic data")."""

    num_samples: int = 100_000
    """Training samples; a multiple of ``val_samples`` (the generator writes files of ``val_samples`` rows)."""
    val_samples: int = 20_000
    """Validation samples (generated after the training ones, by the same teacher)."""
    num_dense: int = 13
    """Dense features per sample."""
    ids_per_bag: List[int] = field(default_factory=lambda: [1])
    """Ids per bag: one value for every table or one per table."""
    variable_bags: bool = False
    """Bag sizes uniform in [0, 2k] instead of exactly k."""
    distribution: str = "zipf"
    """Id distribution: uniform or zipf."""
    skew: List[float] = field(default_factory=lambda: [1.05])
    """Zipf exponent, one value or one per table (0 = uniform)."""
    seed: int = 0
    """Seed of the teacher, ids and labels."""
    base_ctr: float = 0.25
    """Approximate positive rate."""
    dense_strength: float = 1.0
    """Standard deviation of the teacher's dense score."""
    sparse_strength: float = 1.0
    """Standard deviation of the teacher's sparse score."""
    cache_dir: str = ".cache/neo-synthetic"
    """Parent directory of generated data sets (one sub-directory per option set)."""

    def validate(self, where: str) -> None:
        if self.num_samples <= 0 or self.val_samples <= 0:
            raise ConfigError(f"{where}.num_samples / val_samples: must be > 0, got "
                              f"{self.num_samples} / {self.val_samples}")
        if self.num_samples % self.val_samples:
            raise ConfigError(f"{where}.num_samples: must be a multiple of val_samples ({self.val_samples}), "
                              f"got {self.num_samples}")
        if self.num_dense <= 0:
            raise ConfigError(f"{where}.num_dense: must be > 0, got {self.num_dense}")
        if not self.ids_per_bag or any(k <= 0 for k in self.ids_per_bag):
            raise ConfigError(f"{where}.ids_per_bag: must be positive, got {list(self.ids_per_bag)}")
        self.distribution = choice(self.distribution, ["uniform", "zipf"], f"{where}.distribution")
        if not self.skew or any(s < 0 for s in self.skew):
            raise ConfigError(f"{where}.skew: must be >= 0, got {list(self.skew)}")
        if not 0 < self.base_ctr < 1:
            raise ConfigError(f"{where}.base_ctr: must be in (0, 1), got {self.base_ctr}")


@dataclass
class DataConfig:
    """Where training and validation batches come from."""

    source: str = "synthetic"
    """``synthetic`` (generated and cached, see :class:`SyntheticDataConfig`) or ``parquet``."""
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)
    """Generator options (``source: synthetic``)."""
    train_paths: List[str] = field(default_factory=list)
    """Parquet files or directories of the training split (``source: parquet``)."""
    val_paths: List[str] = field(default_factory=list)
    """Parquet files or directories of the validation split (``source: parquet``; empty = no evaluation)."""
    shuffle: bool = True
    """Shuffle training samples within windows (seeded by ``train.seed`` and the epoch)."""
    shuffle_window: int = 262144
    """Samples per shuffle window."""
    prefetch_batches: int = 8
    """Batches the loader's background thread keeps ready."""

    def validate(self, where: str = "data") -> None:
        self.source = choice(self.source, [m.value for m in DataSource], f"{where}.source")
        if self.source == "synthetic":
            self.synthetic.validate(f"{where}.synthetic")
        elif not self.train_paths:
            raise ConfigError(f"{where}.train_paths: needed with source: parquet")
        if self.shuffle_window <= 0:
            raise ConfigError(f"{where}.shuffle_window: must be > 0, got {self.shuffle_window}")
        if self.prefetch_batches < 0:
            raise ConfigError(f"{where}.prefetch_batches: must be >= 0, got {self.prefetch_batches}")
