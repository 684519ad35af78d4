"""Flat storage layout of a group of tables that one kernel launch serves.

Tables with the same weight dtype and optimizer form a *group*. A group keeps all its
tables' weights in one 1-D buffer (as FBGEMM's table-batched embedding does), and its
features' pooled outputs side by side in one ``(B, sum of D)`` matrix.

Worked example: tables ``a`` (rows 3, D 4, features ``fa``) and ``b`` (rows 2, D 8,
features ``fb1``, ``fb2``)::

    table_rows      = [3, 2]
    table_dims      = [4, 8]
    weight_offsets  = [0, 12]        # table t starts at sum(rows * D) of earlier tables; 28 floats in all
    row_offsets     = [0, 3]         # global row of (t, id) = row_offsets[t] + id; 5 rows in all
    feature_table   = [0, 1, 1]      # features fa, fb1, fb2 read tables a, b, b
    output_offsets  = [0, 4, 12, 20] # feature f fills columns output_offsets[f] : output_offsets[f+1]
    feature_mean    = [0, 0, 0]      # 1 where the feature's table pools by mean

Row ``id`` of table ``t`` is ``weights[weight_offsets[t] + id * D_t : ... + D_t]``. A cached table
(``placement: cached``) occupies only its cache: ``table_rows[t]`` is its number of cache slots
and the ids its kernels see are slots (:mod:`neo.embedding.cache`).
Per-element optimizer state (adagrad, adam, lamb) is laid out exactly like the weights;
per-row state (rowwise_adagrad) has one value per global row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

from neo.config.embedding import OptimizerConfig, PoolingMode, TableConfig, WeightDType


@dataclass
class GroupLayout:
    """Static metadata of one kernel group (int64 tensors on the group's device)."""

    tables: List[TableConfig]
    features: List[str]               # features served by this group, in output order
    table_rows: torch.Tensor          # (T,)
    table_dims: torch.Tensor          # (T,)
    weight_offsets: torch.Tensor      # (T,)
    row_offsets: torch.Tensor         # (T,)
    feature_table: torch.Tensor       # (F,)
    output_offsets: torch.Tensor      # (F + 1,)
    feature_mean: torch.Tensor        # (F,) 0 = sum pooling, 1 = mean pooling
    dtype: WeightDType
    optimizer: OptimizerConfig
    stochastic_rounding: bool

    @property
    def num_weights(self) -> int:
        return int((self.table_rows * self.table_dims).sum())

    @property
    def num_rows(self) -> int:
        return int(self.table_rows.sum())

    @property
    def total_dim(self) -> int:
        return int(self.output_offsets[-1])

    @property
    def feature_dims(self) -> List[int]:
        return (self.output_offsets[1:] - self.output_offsets[:-1]).tolist()

    def table_index(self, name: str) -> int:
        return [t.name for t in self.tables].index(name)

    # The layout tensors the CPU kernels take, in their argument order (kernel_tensors).
    KERNEL_FIELDS = ("table_rows", "table_dims", "weight_offsets", "row_offsets", "feature_table",
                     "output_offsets", "feature_mean")

    def kernel_tensors(self) -> Tuple[torch.Tensor, ...]:
        """The layout tensors the CPU kernels take (KERNEL_FIELDS), in their argument order."""
        return tuple(getattr(self, f) for f in self.KERNEL_FIELDS)

    @classmethod
    def build(cls, tables: Sequence[TableConfig], device: torch.device | str = "cpu") -> "GroupLayout":
        tables = list(tables)
        first = tables[0]
        for t in tables[1:]:
            if (t.dtype, t.optimizer, t.stochastic_rounding) != (first.dtype, first.optimizer, first.stochastic_rounding):
                raise ValueError(f"table '{t.name}' differs from '{first.name}' in dtype or optimizer; it needs its own group")
        rows = [t.cache_capacity for t in tables]          # a cached table's kernel rows are its cache slots
        dims = [t.dim for t in tables]
        w_off, r_off, acc_w, acc_r = [], [], 0, 0
        for r, d in zip(rows, dims):
            w_off.append(acc_w)
            r_off.append(acc_r)
            acc_w += r * d
            acc_r += r
        features, feature_table, out_off, mean = [], [], [0], []
        for ti, t in enumerate(tables):
            for f in t.feature_names:
                features.append(f)
                feature_table.append(ti)
                out_off.append(out_off[-1] + t.dim)
                mean.append(1 if t.pooling is PoolingMode.MEAN else 0)
        as_t = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
        return cls(
            tables=tables, features=features,
            table_rows=as_t(rows), table_dims=as_t(dims),
            weight_offsets=as_t(w_off), row_offsets=as_t(r_off),
            feature_table=as_t(feature_table), output_offsets=as_t(out_off), feature_mean=as_t(mean),
            dtype=first.dtype, optimizer=first.optimizer, stochastic_rounding=first.stochastic_rounding,
        )

    def to(self, device: torch.device | str) -> "GroupLayout":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return GroupLayout(**moved)


def group_key(table: TableConfig):
    """Tables with equal keys share one group (one flat buffer, one kernel launch)."""
    return (table.dtype, table.optimizer, table.stochastic_rounding)


def group_tables(tables: Sequence[TableConfig]) -> List[List[TableConfig]]:
    """``tables`` in their groups (equal :func:`group_key`), groups in the order of their first
    table, tables in their own order."""
    grouped: Dict[tuple, List[TableConfig]] = {}
    for t in tables:
        grouped.setdefault(group_key(t), []).append(t)
    return list(grouped.values())
