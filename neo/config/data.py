"""The ``data`` section of Neo's YAML config: synthetic data (generated once, cached) or Parquet.

Synthetic (``source: synthetic``): ``data_pipeline.synthetic`` with a planted teacher writes
``num_samples + val_samples`` samples into ``cache_dir/<key>/`` where ``<key>`` hashes every
generator option (so a changed option generates a new set, an unchanged one is reused). Table
sizes come from the ``tables`` section (one feature per table, in table order); the last
``val_samples`` samples are the validation set. The generator reports the best achievable AUC.

Parquet (``source: parquet``): ``train_paths`` / ``val_paths`` (directories or files) written
by ``neo-data``. Features are matched to the tables' ``feature_names`` by name, or by position
when the names differ (Criteo's ``cat_0 .. cat_25``).

MLPerf (``source: mlperf``): the reference's Criteo 1TB day files (``day_<N>_dense.npy``,
``day_<N>_sparse_multi_hot.npz`` or ``day_<N>_sparse.npy``, ``day_<N>_labels.npy``) in
``mlperf.dir``, memory-mapped; training on ``mlperf.train_days``, evaluation on the first half
(validation) or the second half (test) of ``mlperf.val_day`` (see :class:`MlperfDataConfig` and
docs/data_pipeline.md, "MLPerf reference layout").
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import List, Optional

from data_pipeline.synth_knobs import SynthKnobs
from neo.config.embedding import ConfigError, choice

__all__ = ["DataSource", "MlperfLayout", "SyntheticDataConfig", "MlperfDataConfig", "DataConfig"]

MLPERF_MULTI_HOT_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
"""Ids per bag of the 26 MLPerf DLRM-DCNv2 features (as ``data_pipeline.schema.MLPERF_MULTI_HOT_SIZES``)."""


class DataSource(str, enum.Enum):
    SYNTHETIC = "synthetic"
    PARQUET = "parquet"
    MLPERF = "mlperf"


class MlperfLayout(str, enum.Enum):
    MULTI_HOT = "multi_hot"
    """``day_<N>_sparse_multi_hot.npz``: one (n, k_f) array per feature (MLPerf DLRM-DCNv2)."""
    ONE_HOT = "one_hot"
    """``day_<N>_sparse.npy``: (n, F), one id per feature (TorchRec's Criteo 1TB binary)."""


@dataclass(kw_only=True)
class SyntheticDataConfig(SynthKnobs):
    """Options of the generated data set (see docs/data_pipeline.md, "Synthetic data"): the
    generator's own (:class:`data_pipeline.synth_knobs.SynthKnobs`: num_dense, ids_per_bag,
    variable_bags, distribution, skew, seed, base_ctr, dense_strength, sparse_strength; per table
    means per feature of the ``tables`` section) and the ones below."""

    num_samples: int = 100_000
    """Training samples; a multiple of ``val_samples`` (the generator writes files of ``val_samples`` rows)."""
    val_samples: int = 20_000
    """Validation samples (generated after the training ones, by the same teacher)."""
    cache_dir: str = ".cache/neo-synthetic"
    """Parent directory of generated data sets (one sub-directory per option set)."""
    cache_max_gb: float = 16.0
    """Most GiB the sets in ``cache_dir`` may take: after taking its set, a run removes the least
    recently used others that no process is reading (neo/train/data_cache.py); 0: no limit."""

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
        if not (math.isfinite(self.cache_max_gb) and self.cache_max_gb >= 0):
            raise ConfigError(f"{where}.cache_max_gb: must be a finite number >= 0 (0: no limit), "
                              f"got {self.cache_max_gb}")
        if not 0 < self.base_ctr < 1:
            raise ConfigError(f"{where}.base_ctr: must be in (0, 1), got {self.base_ctr}")


def parse_days(items: List[str], where: str) -> List[int]:
    """``["0-22"]`` or ``[0, 1, 5]`` (YAML ints arrive as strings) -> day numbers, in order."""
    out: List[int] = []
    for k, item in enumerate(items):
        text = str(item).strip()
        try:
            if "-" in text.lstrip("-"):
                a, b = (int(x) for x in text.split("-", 1))
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(text))
        except ValueError:
            raise ConfigError(f"{where}[{k}]: {item!r} is neither a day number nor a range 'a-b' with a <= b") from None
    if any(d < 0 for d in out):
        raise ConfigError(f"{where}: day numbers must be >= 0, got {out}")
    return out


@dataclass
class MlperfDataConfig:
    """The MLPerf / TorchRec Criteo day files (``source: mlperf``; docs/data_pipeline.md)."""

    dir: str = ""
    """Directory of the ``day_<N>_*`` files (written by MLPerf's scripts or ``neo-data mlperf-layout``)."""
    layout: str = "multi_hot"
    """multi_hot (``day_<N>_sparse_multi_hot.npz``) or one_hot (``day_<N>_sparse.npy``)."""
    train_days: List[str] = field(default_factory=lambda: ["0-22"])
    """Training days, in order: numbers and inclusive ranges, e.g. ``[0-22]`` (the reference) or ``[0, 1]``."""
    val_day: Optional[int] = 23
    """The eval day (the reference: 23); null = no evaluation."""
    eval_split: str = "validation"
    """Which half of ``val_day`` evaluation reads: validation (the first ``ceil(n / 2)`` rows) or test (the rest)."""
    multi_hot_sizes: List[int] = field(default_factory=lambda: list(MLPERF_MULTI_HOT_SIZES))
    """multi_hot: ids per bag of each feature, checked against the files (one_hot: every bag is 1 id)."""
    fold_ids: Optional[bool] = None
    """Fold ids modulo their table's num_rows while reading; null = as the reference (one_hot: yes,
    multi_hot: no, its ids were folded when materialized). Unfolded ids are checked (``id_check``)."""
    id_check: str = "head"
    """Ids < num_rows check before training: head (the first ``id_check_rows`` rows of every day),
    full (every id: reads all sparse bytes, ~3.6 TB for the full MLPerf set) or off."""
    id_check_rows: int = 65536
    """Rows per day file the ``head`` check reads (MLPerf multi-hot: 56 MB of ids per day)."""

    def days(self) -> List[int]:
        """The training days as numbers."""
        return parse_days(self.train_days, "data.mlperf.train_days")

    def folds(self) -> bool:
        """Whether ids are folded modulo the table sizes (``fold_ids`` resolved)."""
        return self.layout == MlperfLayout.ONE_HOT.value if self.fold_ids is None else bool(self.fold_ids)

    def validate(self, where: str) -> None:
        if not self.dir:
            raise ConfigError(f"{where}.dir: needed with source: mlperf (the directory of the day_<N>_* files)")
        self.layout = choice(self.layout, [m.value for m in MlperfLayout], f"{where}.layout")
        days = parse_days(self.train_days, f"{where}.train_days")
        if not days:
            raise ConfigError(f"{where}.train_days: at least one day is needed")
        if len(set(days)) != len(days):
            raise ConfigError(f"{where}.train_days: days repeat: {days}")
        if self.val_day is not None and self.val_day < 0:
            raise ConfigError(f"{where}.val_day: must be >= 0 or null, got {self.val_day}")
        if self.val_day is not None and self.val_day in days:
            raise ConfigError(f"{where}.val_day: day {self.val_day} is also a training day ({where}.train_days "
                              f"{list(self.train_days)}): the evaluation would read samples the model trained on")
        self.eval_split = choice(self.eval_split, ["validation", "test"], f"{where}.eval_split")
        if not self.multi_hot_sizes or any(k <= 0 for k in self.multi_hot_sizes):
            raise ConfigError(f"{where}.multi_hot_sizes: must be positive, got {list(self.multi_hot_sizes)}")
        self.id_check = choice(self.id_check, ["head", "full", "off"], f"{where}.id_check")
        if self.id_check_rows <= 0:
            raise ConfigError(f"{where}.id_check_rows: must be > 0, got {self.id_check_rows}")


@dataclass
class DataConfig:
    """Where training and validation batches come from."""

    source: str = "synthetic"
    """``synthetic`` (generated and cached, see :class:`SyntheticDataConfig`), ``parquet`` or
    ``mlperf`` (the reference's day files, see :class:`MlperfDataConfig`)."""
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)
    """Generator options (``source: synthetic``)."""
    mlperf: MlperfDataConfig = field(default_factory=MlperfDataConfig)
    """Day files (``source: mlperf``)."""
    train_paths: List[str] = field(default_factory=list)
    """Parquet files or directories of the training split (``source: parquet``)."""
    val_paths: List[str] = field(default_factory=list)
    """Parquet files or directories of the validation split (``source: parquet``; empty = no evaluation)."""
    shuffle: bool = True
    """Shuffle training samples within windows (seeded by ``train.seed`` and the epoch). With
    ``source: mlperf``, false reads the days in file order as the reference does (its training
    days were shuffled once, on disk)."""
    shuffle_window: int = 262144
    """Samples per shuffle window."""
    first_window: int = 16384
    """Samples of an epoch's first window; the next ones double up to ``shuffle_window``, so the
    first batch waits for a small read (0: every window full-size; see data_pipeline/loader.py)."""
    prefetch_batches: int = 8
    """Batches the loader's background thread keeps ready."""
    loader_nice: int = 10
    """How far the loader's background threads stand below the training thread in the
    scheduler's priority (Linux nice values, 0 to 19; 0: the same), so that training keeps its
    core where the loader's threads and it want more cores than there are
    (``LoaderOptions.thread_nice``, data_pipeline/loader_options.py)."""

    def validate(self, where: str = "data") -> None:
        self.source = choice(self.source, [m.value for m in DataSource], f"{where}.source")
        if self.source == "synthetic":
            self.synthetic.validate(f"{where}.synthetic")
        elif self.source == "mlperf":
            self.mlperf.validate(f"{where}.mlperf")
        elif not self.train_paths:
            raise ConfigError(f"{where}.train_paths: needed with source: parquet")
        if self.shuffle_window <= 0:
            raise ConfigError(f"{where}.shuffle_window: must be > 0, got {self.shuffle_window}")
        if self.first_window < 0:
            raise ConfigError(f"{where}.first_window: must be >= 0, got {self.first_window}")
        if self.prefetch_batches < 0:
            raise ConfigError(f"{where}.prefetch_batches: must be >= 0, got {self.prefetch_batches}")
        if not 0 <= self.loader_nice <= 19:
            raise ConfigError(f"{where}.loader_nice: must be in [0, 19] (a Linux nice value above the training "
                              f"thread's), got {self.loader_nice}")
