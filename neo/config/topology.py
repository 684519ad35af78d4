"""The ``topology`` section of Neo's YAML config: the cluster the planner plans for.

Bandwidths are GB/s (1e9 bytes/s), latencies microseconds, memories GiB. A field left
``null`` takes the value of the cost constants in use (``sharding.cost_constants``, else this
machine's calibration from ``neo calibrate``, else the built-in defaults of its device kind: see
:mod:`neo.planner.constants`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

from neo.config.embedding import ConfigError

__all__ = ["DeviceGroupEntry", "TopologyConfig", "MAX_WORLD_SIZE", "MAX_GIB"]

MAX_WORLD_SIZE = 1 << 16
"""Most ranks a topology may have (the planner keeps per-rank lists: 65,536 ranks plan in ~1 s)."""
MAX_GIB = float(2**32)
"""Most memory per rank, GiB (4 EiB: bytes still fit 64 bits)."""


def _check_ranks(name: str, v, where: str) -> None:
    if v is not None and not 0 < v <= MAX_WORLD_SIZE:
        raise ConfigError(f"{where}.{name}: must be a positive integer <= {MAX_WORLD_SIZE} or null, got {v!r}")


def _check_amount(name: str, v, where: str, zero_ok: bool) -> None:
    """A memory (GiB) or speed: finite, > 0 (>= 0 when ``zero_ok``), memory at most MAX_GIB."""
    ok = math.isfinite(v) and (v >= 0 if zero_ok else v > 0) and (name == "speed" or v <= MAX_GIB)
    if not ok:
        bound = "" if name == "speed" else f" and <= {MAX_GIB:.0f}"
        raise ConfigError(f"{where}.{name}: must be finite, {'>= 0' if zero_ok else '> 0'}{bound}, got {v!r}")


@dataclass
class DeviceGroupEntry:
    """Overrides for some ranks (heterogeneous clusters, as in HetPipe)."""

    ranks: List[int] = field(default_factory=list)
    """Ranks these values apply to."""
    hbm_gib: Optional[float] = None
    """Device memory for embeddings of these ranks (GiB); null = the topology's."""
    host_gib: Optional[float] = None
    """Host memory of these ranks (GiB); null = the topology's."""
    speed: Optional[float] = None
    """Relative speed of these ranks (1.0 = reference); null = the topology's."""


@dataclass
class TopologyConfig:
    """Cluster shape, per-device memory and speed, and link bandwidths/latencies."""

    world_size: Optional[int] = None
    """Total ranks; ``neo plan --world-size`` overrides it."""
    local_world_size: Optional[int] = None
    """Ranks (devices) per node; ``neo plan --local-world-size`` overrides it."""
    batch_size_per_rank: Optional[int] = None
    """Samples per rank per step the plan is made for; default ``train.batch_size`` (``neo train``
    always plans for the batch it trains with)."""
    hbm_gib: float = 80.0
    """Device memory per rank available to embeddings (weights, optimizer state, buffers), GiB."""
    host_gib: float = 256.0
    """Host memory per rank for host-placed (UVM) tables, GiB."""
    speed: float = 1.0
    """Relative speed of every device (see ``devices`` for per-rank values)."""
    devices: List[DeviceGroupEntry] = field(default_factory=list)
    """Per-rank overrides of hbm_gib / host_gib / speed."""
    device_kind: Optional[str] = None
    """cpu, h100 or h200: the machine the plan is for (null: this machine)."""
    hbm_bandwidth_gbps: Optional[float] = None
    """Effective bandwidth of row reads and updates of tables far larger than the caches, GB/s."""
    host_bandwidth_gbps: Optional[float] = None
    """Moves of cached rows between the backing store and the cache, GB/s."""
    intra_node_bandwidth_gbps: Optional[float] = None
    """Per-direction GPU-to-GPU bandwidth within a node, GB/s (NVLink4 ~450)."""
    inter_node_bandwidth_gbps: Optional[float] = None
    """Per-GPU bandwidth across nodes, GB/s (25-50)."""
    intra_node_latency_us: Optional[float] = None
    """Fixed cost of one collective within a node, microseconds."""
    inter_node_latency_us: Optional[float] = None
    """Fixed cost of one collective across nodes, microseconds."""
    imbalance_weight: Optional[float] = None
    """Planner objective: max + imbalance_weight x (max - mean) rank time."""
    memory_headroom: Optional[float] = None
    """Fraction of hbm_gib kept free, in [0, 1)."""
    cost_constants: Optional[str] = None
    """Deprecated spelling of ``sharding.cost_constants`` (a JSON of cost constants)."""

    def validate(self, where: str = "topology") -> None:
        for name in ("world_size", "local_world_size"):
            _check_ranks(name, getattr(self, name), where)
        if self.world_size and self.local_world_size and self.world_size % self.local_world_size:
            raise ConfigError(f"{where}.world_size: {self.world_size} is not a multiple of "
                              f"local_world_size {self.local_world_size}")
        if self.batch_size_per_rank is not None and self.batch_size_per_rank <= 0:
            raise ConfigError(f"{where}.batch_size_per_rank: must be > 0, got {self.batch_size_per_rank!r}")
        for name in ("hbm_gib", "host_gib", "speed"):
            _check_amount(name, getattr(self, name), where, zero_ok=name == "host_gib")
        for name in ("hbm_bandwidth_gbps", "host_bandwidth_gbps", "intra_node_bandwidth_gbps",
                     "inter_node_bandwidth_gbps", "intra_node_latency_us", "inter_node_latency_us"):
            v = getattr(self, name)               # the cost constants they set must be > 0, and finite:
            if v is not None and not (math.isfinite(v) and v > 0):    # an inf makes every plan's cost inf
                raise ConfigError(f"{where}.{name}: must be > 0 and finite, or null, got {v!r}")
        for name in ("imbalance_weight",):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"{where}.{name}: must be >= 0 and finite, or null, got {v!r}")
        if self.device_kind is not None and self.device_kind not in ("cpu", "h100", "h200"):
            raise ConfigError(f"{where}.device_kind: {self.device_kind!r} is not one of ['cpu', 'h100', 'h200']")
        if self.memory_headroom is not None and not 0 <= self.memory_headroom < 1:
            raise ConfigError(f"{where}.memory_headroom: must be in [0, 1), got {self.memory_headroom!r}")
        for k, g in enumerate(self.devices):
            for name in ("hbm_gib", "host_gib", "speed"):
                v = getattr(g, name)
                if v is not None:
                    _check_amount(name, v, f"{where}.devices[{k}]", zero_ok=name != "speed")
            if not g.ranks:
                raise ConfigError(f"{where}.devices[{k}].ranks: must list at least one rank")
            if self.world_size:
                bad = [r for r in g.ranks if not 0 <= r < self.world_size]
                if bad:
                    raise ConfigError(f"{where}.devices[{k}].ranks: {bad} out of range [0, {self.world_size})")

    def to_topology(self, world_size: Optional[int] = None, local_world_size: Optional[int] = None):
        """The planner's :class:`neo.planner.Topology` (arguments override the config)."""
        from neo.planner.types import GIB, Device, Topology

        W = world_size or self.world_size
        L = local_world_size or self.local_world_size or W           # unnamed: one node, as torchrun --standalone
        if not W or not L:
            raise ConfigError("topology.world_size / topology.local_world_size: not set "
                              "(give them in the config or with --world-size / --local-world-size)")
        for name, v in (("world_size", W), ("local_world_size", L)):
            _check_ranks(name, v, "topology")
        if W % L:
            raise ConfigError(f"topology.world_size: {W} is not a multiple of local_world_size {L}")
        hbm = [self.hbm_gib] * W
        host = [self.host_gib] * W
        speed = [self.speed] * W
        for k, g in enumerate(self.devices):
            for r in g.ranks:
                if not 0 <= r < W:
                    raise ConfigError(f"topology.devices[{k}].ranks: rank {r} out of range [0, {W})")
                hbm[r] = g.hbm_gib if g.hbm_gib is not None else hbm[r]
                host[r] = g.host_gib if g.host_gib is not None else host[r]
                speed[r] = g.speed if g.speed is not None else speed[r]
        devs = tuple(Device(int(h * GIB), int(o * GIB), float(s)) for h, o, s in zip(hbm, host, speed))
        return Topology(W, L, devs, int(self.batch_size_per_rank or 512))

    def to_cost_constants(self, world_size: int = 1, path: Optional[str] = None,
                          machine: Optional[dict] = None):
        """(the planner's :class:`neo.planner.CostConstants`, what they are): the file ``path``
        (``sharding.cost_constants``; this section's ``cost_constants`` is its old spelling), else
        this machine's calibration, else the built-in defaults of the device kind; then the
        fields of this section that are set."""
        from dataclasses import replace

        from neo.machine import machine_info
        from neo.planner.constants import resolve_constants
        from neo.planner.types import PlanningError

        machine = dict(machine or machine_info())
        if self.device_kind is not None and self.device_kind != machine.get("device_kind"):
            machine = {"device_kind": self.device_kind}            # planning for another machine
        try:
            c, what = resolve_constants(path or self.cost_constants, machine, world_size)
        except PlanningError as e:
            raise ConfigError(str(e)) from None
        upd, source = {}, {}
        for src, dsts, scale in (("hbm_bandwidth_gbps", ("lookup_bw_cold", "update_bw_cold"), 1e9),
                                 ("host_bandwidth_gbps", ("host_bw",), 1e9),
                                 ("intra_node_bandwidth_gbps", ("intra_bw",), 1e9),
                                 ("inter_node_bandwidth_gbps", ("inter_bw",), 1e9),
                                 ("intra_node_latency_us", ("intra_latency",), 1e-6),
                                 ("inter_node_latency_us", ("inter_latency",), 1e-6),
                                 ("imbalance_weight", ("imbalance_weight",), 1.0),
                                 ("memory_headroom", ("memory_headroom",), 1.0)):
            v = getattr(self, src)
            if v is not None:
                if not math.isfinite(float(v) * scale):     # e.g. 1e308 GB/s: finite, but not in bytes/s
                    raise ConfigError(f"topology.{src}: {v!r} is too large (not finite once converted to "
                                      f"the cost constants' units)")
                upd.update({d: float(v) * scale for d in dsts})
                source.update({d: src for d in dsts})
        if upd:
            what += f"; overridden by topology: {sorted(upd)}"
        try:
            return replace(c, **upd), what
        except PlanningError as e:       # name the field that set the constant (e.g. 1e-320 us -> 0 s)
            fields = sorted({src for d, src in source.items() if d in str(e)})
            raise ConfigError(f"topology{'.' + fields[0] if len(fields) == 1 else ''}: {e}") from None
