"""The ``topology`` section of Neo's YAML config: the cluster the planner plans for.

Bandwidths are GB/s (1e9 bytes/s), latencies microseconds, memories GiB. A field left
``null`` takes the value of the calibration file ``cost_constants`` if given, else the
default of :class:`neo.planner.CostConstants` (an H100 node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from neo.config.embedding import ConfigError

__all__ = ["DeviceGroupEntry", "TopologyConfig"]


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
    batch_size_per_rank: int = 512
    """Samples per rank per step."""
    hbm_gib: float = 80.0
    """Device memory per rank available to embeddings (weights, optimizer state, buffers), GiB."""
    host_gib: float = 256.0
    """Host memory per rank for host-placed (UVM) tables, GiB."""
    speed: float = 1.0
    """Relative speed of every device (see ``devices`` for per-rank values)."""
    devices: List[DeviceGroupEntry] = field(default_factory=list)
    """Per-rank overrides of hbm_gib / host_gib / speed."""
    hbm_bandwidth_gbps: Optional[float] = None
    """Device memory bandwidth, GB/s (H100 ~3000)."""
    host_bandwidth_gbps: Optional[float] = None
    """Device reads of host memory (UVM), GB/s."""
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
    """Path of a JSON of calibrated :class:`neo.planner.CostConstants` fields."""

    def validate(self, where: str = "topology") -> None:
        for name in ("world_size", "local_world_size"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(f"{where}.{name}: must be a positive integer or null, got {v!r}")
        if self.world_size and self.local_world_size and self.world_size % self.local_world_size:
            raise ConfigError(f"{where}.world_size: {self.world_size} is not a multiple of "
                              f"local_world_size {self.local_world_size}")
        if self.batch_size_per_rank <= 0:
            raise ConfigError(f"{where}.batch_size_per_rank: must be > 0, got {self.batch_size_per_rank!r}")
        for name in ("hbm_gib", "host_gib", "speed"):
            if not getattr(self, name) > 0 and not (name == "host_gib" and getattr(self, name) == 0):
                raise ConfigError(f"{where}.{name}: must be > 0, got {getattr(self, name)!r}")
        for name in ("hbm_bandwidth_gbps", "host_bandwidth_gbps", "intra_node_bandwidth_gbps",
                     "inter_node_bandwidth_gbps"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ConfigError(f"{where}.{name}: must be > 0 or null, got {v!r}")
        for name in ("intra_node_latency_us", "inter_node_latency_us", "imbalance_weight"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"{where}.{name}: must be >= 0 or null, got {v!r}")
        if self.memory_headroom is not None and not 0 <= self.memory_headroom < 1:
            raise ConfigError(f"{where}.memory_headroom: must be in [0, 1), got {self.memory_headroom!r}")
        for k, g in enumerate(self.devices):
            for name in ("hbm_gib", "host_gib", "speed"):
                v = getattr(g, name)
                if v is not None and v < 0 or (name == "speed" and v is not None and v == 0):
                    raise ConfigError(f"{where}.devices[{k}].{name}: must be > 0 or null, got {v!r}")
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
        L = local_world_size or self.local_world_size
        if not W or not L:
            raise ConfigError("topology.world_size / topology.local_world_size: not set "
                              "(give them in the config or with --world-size / --local-world-size)")
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
        return Topology(W, L, devs, int(self.batch_size_per_rank))

    def to_cost_constants(self):
        """The planner's :class:`neo.planner.CostConstants`: calibration file, then these fields."""
        from dataclasses import replace

        from neo.planner.types import CostConstants, PlanningError

        try:
            c = CostConstants.from_json(self.cost_constants) if self.cost_constants else CostConstants()
        except (OSError, ValueError, PlanningError) as e:
            raise ConfigError(f"topology.cost_constants: cannot load {self.cost_constants!r}: {e}") from None
        upd = {}
        for src, dst, scale in (("hbm_bandwidth_gbps", "hbm_bw", 1e9), ("host_bandwidth_gbps", "host_bw", 1e9),
                                ("intra_node_bandwidth_gbps", "intra_bw", 1e9),
                                ("inter_node_bandwidth_gbps", "inter_bw", 1e9),
                                ("intra_node_latency_us", "intra_latency", 1e-6),
                                ("inter_node_latency_us", "inter_latency", 1e-6),
                                ("imbalance_weight", "imbalance_weight", 1.0),
                                ("memory_headroom", "memory_headroom", 1.0)):
            v = getattr(self, src)
            if v is not None:
                upd[dst] = float(v) * scale
        return replace(c, **upd)
