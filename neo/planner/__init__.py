"""Neo's sharding planner (pure Python + numpy; no process group).

Stages: :mod:`enumerate` (options per table) -> :mod:`cost` (estimates) ->
:mod:`planner` (proposals, pick) -> :mod:`partition` (greedy, Karmarkar-Karp) and
:mod:`refine` (local search)
-> :mod:`plan` (JSON) -> :mod:`report` (text). See docs/planner.md.
"""

from neo.planner.constants import CostConstants, builtin_constants, resolve_constants  # noqa: F401
from neo.planner.cost import PartCosts, estimate_parts  # noqa: F401
from neo.planner.enumerate import Option, enumerate_options  # noqa: F401
from neo.planner.partition import Assignment, Problem, greedy, karmarkar_karp  # noqa: F401
from neo.planner.refine import refine  # noqa: F401
from neo.planner.plan import Plan, RankStats, TablePlan  # noqa: F401
from neo.planner.planner import PARTITIONERS, evaluate_plan, plan_tables  # noqa: F401
from neo.planner.report import format_report  # noqa: F401
from neo.planner.types import (  # noqa: F401
    GIB,
    Device,
    Placement,
    PlanningError,
    Shard,
    ShardingType,
    TableConstraints,
    TableSpec,
    Topology,
    check_shards_tile,
)
