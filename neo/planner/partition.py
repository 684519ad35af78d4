"""Stage 4: partitioners that place shards on ranks.

The problem (:class:`Problem`) is a makespan problem on *related* machines with memory
capacities: rank r has speed s_r; an item i costs ``compute_i / s_r + comm_i`` seconds on
it and ``hbm_i`` bytes. Fixed loads (row-wise, data-parallel shards, the input side of
every table) are the ranks' base loads. Node groups (table_row_wise, table_column_wise)
are placed on one node at a time, before the single shards: the hierarchical step
(across nodes first, then within the node), as in the Neo paper.

- :func:`greedy`: LPT (largest item first onto the rank where it finishes first, with room).
  Graham 1969: <= 4/3 - 1/(3m) of the optimum on identical ranks.
- :func:`karmarkar_karp`: multiway largest differencing (Karmarkar & Karp 1982; Korf's
  multiway generalization, "Multi-way number partitioning", IJCAI 2009), with the base
  loads as one more W-tuple so that ranks keep their identity. Memory-oblivious; the
  planner discards infeasible results (refinement may repair them).
- :func:`neo.planner.refine.refine`: local search from a start assignment: repeatedly takes the most loaded
  rank and applies the best move (one item to another rank) or, failing that, the best
  pairwise swap that lowers the pair's max below the current max, or, failing that, an
  exact re-partition of the items of the max rank and one other rank (when they hold
  at most 14 items; the 16 least-loaded such partners are tried), respecting memory and pins; vectorized with numpy over all
  candidates. Never worse than its start.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from neo.planner.types import GIB, PlanningError

__all__ = ["Group", "Problem", "Assignment", "greedy", "karmarkar_karp", "evaluate", "objective", "fits",
           "lower_bound"]

_EPS = 1e-12


@dataclass(frozen=True)
class Group:
    """Parts that go to the ranks of ONE node (ordered: part j on local rank j % L)."""

    name: str
    compute: np.ndarray
    comm: np.ndarray
    hbm: np.ndarray
    host: np.ndarray
    ordered: bool
    allowed_nodes: Optional[Tuple[int, ...]] = None


@dataclass(frozen=True)
class Problem:
    """Everything a partitioner needs; arrays over ranks (W) and single items (n)."""

    local_world_size: int
    speed: np.ndarray
    hbm_cap: np.ndarray
    host_cap: np.ndarray
    base_load: np.ndarray
    base_hbm: np.ndarray
    base_host: np.ndarray
    compute: np.ndarray
    comm: np.ndarray
    hbm: np.ndarray
    host: np.ndarray
    allowed: np.ndarray
    """Bool [n, W]: rank r may hold item i (pins)."""
    names: Tuple[str, ...]
    """Table name of each single item (for errors)."""
    groups: Tuple[Group, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.speed)

    @property
    def n(self) -> int:
        return len(self.compute)

    def cost_matrix(self) -> np.ndarray:
        """Seconds of item i on rank r, [n, W]."""
        return self.compute[:, None] / self.speed[None, :] + self.comm[:, None]


@dataclass(frozen=True)
class Assignment:
    """Rank of each single item and ranks of each group's parts."""

    rank: np.ndarray
    group_ranks: Tuple[np.ndarray, ...]
    algorithm: str


def _group_parts_on(g: Group, ranks_sorted_local: Sequence[int], node: int, L: int) -> np.ndarray:
    k = len(g.compute)
    if g.ordered:
        return node * L + (np.arange(k) % L)
    order = np.argsort(-(g.compute + g.comm), kind="stable")
    out = np.empty(k, dtype=np.int64)
    out[order] = np.asarray(ranks_sorted_local)[np.arange(k) % L]
    return out


def _place_groups(p: Problem, loads, hbm, host) -> Tuple[List[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """Greedy (largest group first) node choice minimizing the node's resulting max load."""
    L, W = p.local_world_size, p.world_size
    N = W // L
    placed: List[Optional[np.ndarray]] = [None] * len(p.groups)
    order = sorted(range(len(p.groups)), key=lambda j: -float((p.groups[j].compute + p.groups[j].comm).sum()))
    for j in order:
        g = p.groups[j]
        best, best_key, best_miss = None, None, None
        for node in (g.allowed_nodes or range(N)):
            nr = np.arange(node * L, (node + 1) * L)
            ranks = _group_parts_on(g, nr[np.argsort(loads[nr], kind="stable")], node, L)
            dl = np.zeros(W)
            np.add.at(dl, ranks, g.compute / p.speed[ranks] + g.comm)
            dh = np.zeros(W)
            np.add.at(dh, ranks, g.hbm)
            dho = np.zeros(W)
            np.add.at(dho, ranks, g.host)
            miss = max(float((hbm + dh - p.hbm_cap)[nr].max()), float((host + dho - p.host_cap)[nr].max()))
            if miss > 0:
                best_miss = miss if best_miss is None else min(best_miss, miss)
                continue
            new = loads + dl
            key = (float(new[nr].max()), float(new[nr].sum()))
            if best_key is None or key < best_key:
                best, best_key = (ranks, dl, dh, dho), key
        if best is None:
            raise PlanningError(f"table '{g.name}': no node has room for its shards; "
                                f"{best_miss:.0f} bytes ({best_miss / GIB:.2f} GiB) missing on the best node")
        ranks, dl, dh, dho = best
        placed[j] = ranks
        loads, hbm, host = loads + dl, hbm + dh, host + dho
    return placed, loads, hbm, host


def _place_greedy(p: Problem, items: np.ndarray, cost: np.ndarray, rank: np.ndarray, loads, hbm, host):
    """LPT over ``items`` (already ordered), memory- and pin-aware; fills ``rank`` in place."""
    for i in items:
        ok = p.allowed[i] & (hbm + p.hbm[i] <= p.hbm_cap) & (host + p.host[i] <= p.host_cap)
        if not ok.any():
            free = np.where(p.allowed[i], p.hbm_cap - hbm, -np.inf).max()
            miss = float(p.hbm[i] - free)
            raise PlanningError(
                f"table '{p.names[i]}': no rank has room for a shard of {p.hbm[i]:.0f} bytes "
                f"({p.hbm[i] / GIB:.2f} GiB); {max(miss, 0):.0f} bytes ({max(miss, 0) / GIB:.2f} GiB) missing "
                f"on the emptiest allowed rank")
        new = np.where(ok, loads + cost[i], np.inf)
        r = int(np.argmin(new))
        rank[i] = r
        loads[r] += cost[i, r]
        hbm[r] += p.hbm[i]
        host[r] += p.host[i]
    return loads, hbm, host


def _start(p: Problem):
    return p.base_load.astype(np.float64).copy(), p.base_hbm.astype(np.float64).copy(), p.base_host.astype(np.float64).copy()


def greedy(p: Problem, cost: Optional[np.ndarray] = None) -> Assignment:
    """Largest-processing-time-first onto the rank where the item finishes first."""
    cost = p.cost_matrix() if cost is None else cost
    loads, hbm, host = _start(p)
    groups, loads, hbm, host = _place_groups(p, loads, hbm, host)
    rank = np.full(p.n, -1, dtype=np.int64)
    order = np.argsort(-cost.max(axis=1), kind="stable")
    _place_greedy(p, order, cost, rank, loads, hbm, host)
    return Assignment(rank, tuple(groups), "greedy")


def karmarkar_karp(p: Problem, cost: Optional[np.ndarray] = None) -> Assignment:
    """Multiway largest differencing over the unpinned single items.

    Each item is a W-tuple (w_i, 0, ..., 0); the base loads (after groups and pinned items
    are placed greedily) form one more tuple whose slots carry the rank ids. Repeatedly the
    two tuples with the largest spread (max - min) are merged, the largest slot of one with
    the smallest of the other. Slots are tracked with a union-find over ids.
    """
    cost = p.cost_matrix() if cost is None else cost
    W, n = p.world_size, p.n
    loads, hbm, host = _start(p)
    groups, loads, hbm, host = _place_groups(p, loads, hbm, host)
    rank = np.full(n, -1, dtype=np.int64)
    pinned = np.nonzero(~p.allowed.all(axis=1))[0]
    pinned = pinned[np.argsort(-cost[pinned].max(axis=1), kind="stable")]
    loads, hbm, host = _place_greedy(p, pinned, cost, rank, loads, hbm, host)
    free = np.nonzero(p.allowed.all(axis=1))[0]
    if len(free):
        weight = p.compute / float(np.mean(p.speed)) + p.comm
        parent = np.arange(n + W)
        heap = []
        order = np.argsort(-loads, kind="stable")
        base_l = loads[order]
        heap.append((-(base_l[0] - base_l[-1]), -1, base_l, (n + order).astype(np.int64)))
        empty_ids = np.full(W - 1, -1, dtype=np.int64)
        zeros = np.zeros(W - 1)
        for i in free:
            heap.append((-float(weight[i]), int(i), np.concatenate([[weight[i]], zeros]),
                         np.concatenate([[i], empty_ids])))
        heapq.heapify(heap)
        counter = n
        while len(heap) > 1:
            _, _, la, ia = heapq.heappop(heap)
            _, _, lb, ib = heapq.heappop(heap)
            lb, ib = lb[::-1], ib[::-1]
            both = (ia >= 0) & (ib >= 0)
            parent[ib[both]] = ia[both]
            nl = la + lb
            ni = np.where(ia >= 0, ia, ib)
            o = np.argsort(-nl, kind="stable")
            nl, ni = nl[o], ni[o]
            counter += 1
            heapq.heappush(heap, (-(nl[0] - nl[-1]), counter, nl, ni))
        root = parent.copy()
        while True:
            nxt = root[root]
            if np.array_equal(nxt, root):
                break
            root = nxt
        rank_of_root = np.full(n + W, -1, dtype=np.int64)
        rank_of_root[root[n:]] = np.arange(W)
        rank[free] = rank_of_root[root[free]]
    return Assignment(rank, tuple(groups), "karmarkar_karp")


def evaluate(p: Problem, a: Assignment, cost: Optional[np.ndarray] = None):
    """(loads seconds, hbm bytes, host bytes) per rank of an assignment."""
    cost = p.cost_matrix() if cost is None else cost
    W = p.world_size
    loads, hbm, host = _start(p)
    idx = np.arange(p.n)
    loads += np.bincount(a.rank, weights=cost[idx, a.rank], minlength=W)
    hbm += np.bincount(a.rank, weights=p.hbm, minlength=W)
    host += np.bincount(a.rank, weights=p.host, minlength=W)
    for g, ranks in zip(p.groups, a.group_ranks):
        np.add.at(loads, ranks, g.compute / p.speed[ranks] + g.comm)
        np.add.at(hbm, ranks, g.hbm)
        np.add.at(host, ranks, g.host)
    return loads, hbm, host


def objective(loads: np.ndarray, imbalance_weight: float):
    """max + imbalance_weight * (max - mean) of the rank times: a float for (W,) loads, one per
    row for [K, W] (refine's exhaustive search of tiny problems)."""
    mx = loads.max(axis=-1)
    out = mx + imbalance_weight * (mx - loads.mean(axis=-1))
    return float(out) if np.ndim(out) == 0 else out


def fits(p: Problem, hbm: np.ndarray, host: np.ndarray):
    """Whether the memory fits every rank: a bool for (W,) bytes, one per row for [K, W]."""
    out = (hbm <= p.hbm_cap * (1 + 1e-12)).all(axis=-1) & (host <= p.host_cap * (1 + 1e-12)).all(axis=-1)
    return bool(out) if np.ndim(out) == 0 else out


def lower_bound(p: Problem, cost: Optional[np.ndarray] = None) -> float:
    """Seconds below which no assignment's busiest rank can be, memory aside: the most loaded
    base; every item on its cheapest allowed rank over that rank's base; and the mean load
    when each item and group part costs its least (on its cheapest rank, a part at the fastest
    speed). The planner skips partitioning a proposal whose bound already loses."""
    cost = p.cost_matrix() if cost is None else cost
    W = p.world_size
    base = p.base_load.astype(np.float64)
    bound = float(base.max()) if W else 0.0
    total = float(base.sum())
    if p.n:
        on = np.where(p.allowed, cost + base[None, :], np.inf).min(axis=1)
        bound = max(bound, float(on.max()))
        total += float(np.where(p.allowed, cost, np.inf).min(axis=1).sum())
    fastest = float(p.speed.max()) if W else 1.0
    for g in p.groups:
        total += float((g.compute / fastest + g.comm).sum())
    return max(bound, total / max(W, 1))
