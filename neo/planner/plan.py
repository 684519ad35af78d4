"""The planner's output: a :class:`Plan` that serializes to JSON and back.

JSON shape (documented in docs/planner.md)::

    {"world_size": W, "local_world_size": L,
     "tables": {NAME: {"sharding_type": "table_wise", "placement": "device",
                       "shards": [{"rank": r, "row_offset": o, "rows": n, "col_offset": c, "cols": d}],
                       # placement "cached" only: each shard caches this share of its rows
                       "cache_load_factor": f, "cache_rows": k, "expected_hit_rate": h, "miss_ms": m}},
     "ranks": [{"rank": r, "memory_bytes": m, "host_memory_bytes": h, "predicted_ms": t,
                "compute_ms": x, "comm_ms": y, "comm_bytes_intra": a, "comm_bytes_inter": b}],
     "summary": {"partitioner": "...", "proposal": "...", "max_ms": .., "mean_ms": .., "imbalance": ..,
                 "objective_ms": .., "candidates": [...]}}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from neo.planner.types import Placement, Shard, ShardingType, TableSpec, tiling_error

__all__ = ["TablePlan", "RankStats", "Plan"]


@dataclass(frozen=True)
class TablePlan:
    """How one table is sharded and where its shards live."""

    sharding_type: ShardingType
    shards: Tuple[Shard, ...]
    placement: Placement = Placement.DEVICE
    cache_load_factor: Optional[float] = None
    """Cached tables: the share of each shard's rows its cache holds."""
    cache_rows: Optional[int] = None
    """Cached tables: cache rows of all shards together."""
    expected_hit_rate: Optional[float] = None
    """Cached tables: predicted hit rate of a step's distinct rows."""
    miss_ms: Optional[float] = None
    """Cached tables: predicted milliseconds a step spends moving misses (its slowest shard)."""

    def to_dict(self) -> Dict[str, Any]:
        d = {"sharding_type": self.sharding_type.value, "placement": self.placement.value,
             "shards": [asdict(s) for s in self.shards]}
        if self.placement is Placement.CACHED:
            d.update(cache_load_factor=self.cache_load_factor, cache_rows=self.cache_rows,
                     expected_hit_rate=self.expected_hit_rate, miss_ms=self.miss_ms)
        return d

    @staticmethod
    def from_dict(d: Dict[str, Any]) -> "TablePlan":
        return TablePlan(ShardingType(d["sharding_type"]), tuple(Shard(**s) for s in d["shards"]),
                         Placement(d.get("placement", "device")), d.get("cache_load_factor"), d.get("cache_rows"),
                         d.get("expected_hit_rate"), d.get("miss_ms"))


@dataclass(frozen=True)
class RankStats:
    """Predicted per-step numbers of one rank."""

    rank: int
    memory_bytes: int
    """Device memory (HBM): weights, optimizer state, buffers, caches."""
    predicted_ms: float
    """compute_ms + comm_ms + the collectives' fixed latency."""
    compute_ms: float = 0.0
    comm_ms: float = 0.0
    comm_bytes_intra: float = 0.0
    comm_bytes_inter: float = 0.0
    host_memory_bytes: int = 0


@dataclass(frozen=True)
class Plan:
    world_size: int
    local_world_size: int
    tables: Dict[str, TablePlan]
    ranks: Tuple[RankStats, ...]
    summary: Dict[str, Any] = field(default_factory=dict)

    @property
    def max_ms(self) -> float:
        return max(r.predicted_ms for r in self.ranks)

    @property
    def mean_ms(self) -> float:
        return sum(r.predicted_ms for r in self.ranks) / len(self.ranks)

    @property
    def imbalance(self) -> float:
        """max / mean predicted rank time (1.0 = perfectly balanced)."""
        mean = self.mean_ms
        return self.max_ms / mean if mean > 0 else 1.0

    def shards_on(self, rank: int) -> List[Tuple[str, Shard]]:
        return [(name, s) for name, t in self.tables.items() for s in t.shards if s.rank == rank]

    def to_dict(self) -> Dict[str, Any]:
        return {
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "tables": {name: t.to_dict() for name, t in self.tables.items()},
            "ranks": [asdict(r) for r in self.ranks],
            "summary": self.summary,
        }

    @staticmethod
    def from_dict(d: Dict[str, Any]) -> "Plan":
        return Plan(int(d["world_size"]), int(d["local_world_size"]),
                    {name: TablePlan.from_dict(t) for name, t in d["tables"].items()},
                    tuple(RankStats(**r) for r in d["ranks"]), dict(d.get("summary", {})))

    def to_json(self, indent: int = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @staticmethod
    def from_json(text: str) -> "Plan":
        return Plan.from_dict(json.loads(text))

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())
            f.write("\n")

    @staticmethod
    def load(path: str) -> "Plan":
        with open(path) as f:
            return Plan.from_json(f.read())

    def mismatch(self, specs: Sequence[TableSpec], world_size: int, local_world_size: int) -> Optional[str]:
        """Why this plan cannot run ``specs`` on this world (its size, its tables, their shapes and
        its shards' ranks), or None."""
        if (self.world_size, self.local_world_size) != (world_size, local_world_size):
            return (f"planned for {self.world_size} ranks ({self.local_world_size} per host); this run has "
                    f"{world_size} ({local_world_size} per host)")
        want = {s.name: s for s in specs}
        missing, extra = sorted(set(want) - set(self.tables)), sorted(set(self.tables) - set(want))
        if missing or extra:
            return f"its tables differ from the config's: not planned {missing}, not in the config {extra}"
        for name, tp in self.tables.items():
            spec = want[name]
            bad = [s for s in tp.shards if not 0 <= s.rank < world_size]
            if bad:
                return f"table {name!r}: shard on rank {bad[0].rank}, outside ranks 0..{world_size - 1}"
            allowed = spec.constraints.sharding_types
            if allowed and tp.sharding_type not in allowed:
                return (f"table {name!r}: the plan shards it {tp.sharding_type.value}, the config allows only "
                        f"{[t.value for t in allowed]} (sharding.types, or the table's sharding_types)")
            if tp.sharding_type is ShardingType.DATA_PARALLEL:
                err = next((f"replica {s} is not the whole {spec.rows} x {spec.dim} table" for s in tp.shards
                            if (s.row_offset, s.rows, s.col_offset, s.cols) != (0, spec.rows, 0, spec.dim)), None)
            else:
                err = tiling_error(spec.rows, spec.dim, tp.shards)
            if err:
                return f"table {name!r} ({spec.rows} x {spec.dim} in the config): {err}"
            if tp.placement is Placement.CACHED:
                f = tp.cache_load_factor
                if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f <= 1:
                    return (f"table {name!r}: placement 'cached' needs cache_load_factor, the share of its rows "
                            f"the cache holds, in (0, 1]; the plan has {f!r}")
                if tp.cache_rows is not None and (not isinstance(tp.cache_rows, int) or tp.cache_rows <= 0):
                    return f"table {name!r}: cache_rows must be a positive integer, the plan has {tp.cache_rows!r}"
        return None
