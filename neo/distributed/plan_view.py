"""A typed, validated view of a sharding plan, read from the planner's JSON shape.

The runtime reads the plain data the planner's ``Plan`` serializes to (it shares only the
planner's ``ShardingType`` enum) (a dict, a JSON string, or any object with ``to_dict()`` / ``to_json()``)::

    {"world_size": 4, "local_world_size": 2,
     "tables": {"t0": {"sharding_type": "row_wise",
                       "shards": [{"rank": 0, "row_offset": 0,  "rows": 50, "col_offset": 0, "cols": 16},
                                  {"rank": 1, "row_offset": 50, "rows": 50, "col_offset": 0, "cols": 16}, ...]}},
     "ranks": [...]}                       # per-rank summaries; ignored here

:meth:`PlanView.from_plan` checks everything the runtime relies on and names the table and
the rule broken: shards tile the table exactly (no gap, no overlap), ranks exist, each
sharding type has its shape (table_wise: one full shard; row_wise / table_row_wise: full
columns, one shard per rank; column_wise / table_column_wise: full rows; data_parallel:
one full replica on every rank; the table_* types on the ranks of one node).

:func:`even_plan` builds simple plans (near-equal shards) for tests and benchmarks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from neo.config.embedding import TableConfig
from neo.planner.types import Shard, ShardingType, tiling_error

__all__ = ["ShardingType", "Shard", "TablePlanView", "PlanView", "PlanError", "even_plan"]



class PlanError(ValueError):
    """A plan the runtime cannot execute; the message names the table and the rule."""


@dataclass(frozen=True)
class TablePlanView:
    name: str
    sharding_type: ShardingType
    shards: Tuple[Shard, ...]
    """Non-empty shards, sorted by (col_offset, row_offset, rank)."""

    @property
    def ranks(self) -> Tuple[int, ...]:
        return tuple(s.rank for s in self.shards)


@dataclass(frozen=True)
class PlanView:
    world_size: int
    local_world_size: int
    tables: Dict[str, TablePlanView]

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size

    def types(self) -> Tuple[ShardingType, ...]:
        return tuple(sorted({t.sharding_type for t in self.tables.values()}, key=list(ShardingType).index))

    def to_dict(self) -> Dict[str, Any]:
        return {
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "tables": {n: {"sharding_type": t.sharding_type.value,
                           "shards": [s.__dict__.copy() for s in t.shards]} for n, t in self.tables.items()},
        }

    @classmethod
    def from_plan(cls, plan: Any, tables: Sequence[TableConfig]) -> "PlanView":
        """Read and validate ``plan`` (dict, JSON string, or object with to_dict/to_json) against ``tables``."""
        d = _as_dict(plan)
        for key in ("world_size", "local_world_size", "tables"):
            if key not in d:
                raise PlanError(f"plan: missing field '{key}' (fields: {sorted(d)})")
        W, L = d["world_size"], d["local_world_size"]
        if not isinstance(W, int) or not isinstance(L, int) or W <= 0 or L <= 0 or W % L:
            raise PlanError(f"plan: world_size {W!r} must be a positive multiple of local_world_size {L!r}")
        configs = {t.name: t for t in tables}
        unknown = sorted(set(d["tables"]) - set(configs))
        missing = [n for n in configs if n not in d["tables"]]
        if unknown:
            raise PlanError(f"plan: tables {unknown} are not among the model's tables {list(configs)}")
        if missing:
            raise PlanError(f"plan: no placement for tables {missing}")
        views = {}
        for name, cfg in configs.items():               # model's table order
            views[name] = _table_view(name, d["tables"][name], cfg, W, L)
        return cls(W, L, views)


def _as_dict(plan: Any) -> Mapping[str, Any]:
    if isinstance(plan, Mapping):
        return plan
    if isinstance(plan, PlanView):
        return plan.to_dict()
    if isinstance(plan, str):
        return json.loads(plan)
    if hasattr(plan, "to_dict"):
        return plan.to_dict()
    if hasattr(plan, "to_json"):
        return json.loads(plan.to_json())
    raise PlanError(f"plan: expected a dict, a JSON string or an object with to_dict()/to_json(), got {type(plan).__name__}")


def _table_view(name: str, entry: Mapping[str, Any], cfg: TableConfig, W: int, L: int) -> TablePlanView:
    where = f"plan: table '{name}'"
    try:
        st = ShardingType(entry["sharding_type"])
    except (KeyError, ValueError):
        raise PlanError(f"{where}: sharding_type {entry.get('sharding_type')!r} is not one of "
                        f"{[s.value for s in ShardingType]}") from None
    shards = []
    for i, s in enumerate(entry.get("shards", [])):
        try:
            sv = Shard(*(int(s[k]) for k in ("rank", "row_offset", "rows", "col_offset", "cols")))
        except (KeyError, TypeError, ValueError):
            raise PlanError(f"{where}: shard {i} needs integer rank, row_offset, rows, col_offset, cols; got {s!r}") from None
        if not 0 <= sv.rank < W:
            raise PlanError(f"{where}: shard {i} on rank {sv.rank}, outside [0, {W})")
        if sv.rows < 0 or sv.cols < 0 or sv.row_offset < 0 or sv.col_offset < 0:
            raise PlanError(f"{where}: shard {i} has a negative size or offset: {s!r}")
        if sv.row_offset + sv.rows > cfg.num_rows or sv.col_offset + sv.cols > cfg.dim:
            raise PlanError(f"{where}: shard {i} {s!r} exceeds the table ({cfg.num_rows} rows x {cfg.dim} cols)")
        if sv.rows and sv.cols % 4:
            raise PlanError(f"{where}: shard {i} has {sv.cols} columns; shards need a multiple of 4")
        if sv.rows and sv.cols:
            shards.append(sv)
    full = lambda s: (s.row_offset, s.rows, s.col_offset, s.cols) == (0, cfg.num_rows, 0, cfg.dim)  # noqa: E731
    ranks = [s.rank for s in shards]
    if st is ShardingType.DATA_PARALLEL:
        if sorted(ranks) != list(range(W)) or not all(full(s) for s in shards):
            raise PlanError(f"{where}: data_parallel needs one full replica on every rank 0..{W - 1}, got ranks {sorted(ranks)}")
        return TablePlanView(name, st, tuple(sorted(shards, key=lambda s: s.rank)))
    err = tiling_error(cfg.num_rows, cfg.dim, shards)
    if err:
        raise PlanError(f"{where}: {err}")
    if st is ShardingType.TABLE_WISE and len(shards) != 1:
        raise PlanError(f"{where}: table_wise needs exactly one shard, got {len(shards)}")
    if st.splits_rows:
        if any((s.col_offset, s.cols) != (0, cfg.dim) for s in shards):
            raise PlanError(f"{where}: {st.value} shards must span all {cfg.dim} columns")
        if len(set(ranks)) != len(ranks):
            raise PlanError(f"{where}: {st.value} allows one row shard per rank, got ranks {ranks}")
    if st.splits_cols and any((s.row_offset, s.rows) != (0, cfg.num_rows) for s in shards):
        raise PlanError(f"{where}: {st.value} shards must span all {cfg.num_rows} rows")
    if st.within_node and len({r // L for r in ranks}) != 1:
        raise PlanError(f"{where}: {st.value} shards must lie on the ranks of one node "
                        f"(local_world_size {L}), got ranks {ranks}")
    return TablePlanView(name, st, tuple(sorted(shards, key=lambda s: (s.col_offset, s.row_offset, s.rank))))


def _split(total: int, parts: int, quantum: int = 1) -> list:
    units = total // quantum
    q, r = divmod(units, parts)
    return [(q + (1 if i < r else 0)) * quantum for i in range(parts)]


def even_plan(tables: Sequence[TableConfig], types: Mapping[str, Any], world_size: int,
              local_world_size: Optional[int] = None, column_shards: int = 2,
              ranks: Optional[Mapping[str, int]] = None, nodes: Optional[Mapping[str, int]] = None) -> Dict[str, Any]:
    """A plan dict with near-equal shards (the planner's JSON shape), for tests and benchmarks.

    Args:
        types: sharding type per table name.
        column_shards: column shards of column_wise tables (table_column_wise: one per node rank).
        ranks: rank of table_wise tables and first rank of column_wise ones (default: table i on
            rank i * W // T, so each rank's tables are consecutive and its output block needs no permutation).
        nodes: node of table_row_wise / table_column_wise tables (default: round robin).
    """
    W = world_size
    L = local_world_size or W
    out: Dict[str, Any] = {}
    for i, t in enumerate(tables):
        st = ShardingType(getattr(types[t.name], "value", types[t.name]))
        R, D = t.num_rows, t.dim
        r0 = (ranks or {}).get(t.name, i * W // len(tables))     # contiguous blocks of tables per rank
        node = (nodes or {}).get(t.name, i % (W // L))
        sh = lambda rank, ro, nr, co, nc: dict(rank=rank, row_offset=ro, rows=nr, col_offset=co, cols=nc)  # noqa: E731
        if st is ShardingType.DATA_PARALLEL:
            shards = [sh(r, 0, R, 0, D) for r in range(W)]
        elif st is ShardingType.TABLE_WISE:
            shards = [sh(r0, 0, R, 0, D)]
        elif st.splits_rows:
            owners = list(range(W)) if st is ShardingType.ROW_WISE else list(range(node * L, (node + 1) * L))
            sizes, acc, shards = _split(R, len(owners)), 0, []
            for r, n in zip(owners, sizes):
                shards.append(sh(r, acc, n, 0, D))
                acc += n
        else:
            if st is ShardingType.COLUMN_WISE:
                owners = [(r0 + k) % W for k in range(column_shards)]
            else:
                owners = list(range(node * L, (node + 1) * L))
            sizes, acc, shards = _split(D, len(owners), 4), 0, []
            for r, n in zip(owners, sizes):
                shards.append(sh(r, 0, R, acc, n))
                acc += n
        out[t.name] = {"sharding_type": st.value, "shards": shards}
    return {"world_size": W, "local_world_size": L, "tables": out}
