"""The ``async_train`` section of Neo's YAML config: wave synchronous parallel (WSP) training.

``mode: bsp`` (the default) is Neo's synchronous trainer (:class:`neo.train.trainer.Trainer`).
``mode: wsp`` trains under bounded staleness (:mod:`neo.async_train`, docs/async.md): every
virtual worker runs ``wave_steps`` local steps on the state it has, pushes their accumulated
gradients to the parameter server at the wave's end, and may start a wave only while it is at
most ``staleness`` waves ahead of the slowest worker. ``staleness: 0`` trains exactly as the
synchronous trainer with gradients accumulated over ``wave_steps`` steps (with ``wave_steps:
1``: exactly as ``mode: bsp``, tested). Example::

    async_train:
      mode: wsp
      staleness: 2          # a worker may be 2 waves ahead of the slowest
      wave_steps: 4         # 4 local steps per wave (one push each)
      slowdown:             # emulate a 3x slower rank 1 (a sleep after each of its steps)
        - {rank: 1, factor: 3}

(``async`` itself is a Python keyword, hence the section's name.)
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, List, Optional

from neo.config.embedding import ConfigError, choice, field_default

__all__ = ["AsyncMode", "AsyncTrainConfig", "SlowdownEntry"]


class AsyncMode(str, enum.Enum):
    """How the workers synchronize."""

    BSP = "bsp"
    """Bulk synchronous: Neo's synchronous trainer (every step's gradients reduced before the next)."""
    WSP = "wsp"
    """Wave synchronous parallel, bounded staleness (HetPipe's WSP; Park et al., ATC 2020, section 5)."""


@dataclass
class SlowdownEntry:
    """An emulated slower rank: each of its local steps is stretched by a sleep."""

    rank: int = 0
    """The rank slowed."""
    factor: float = 1.0
    """A slowed step lasts ``factor`` x its measured compute (a sleep of ``(factor - 1) x`` it); >= 1."""
    probability: float = 1.0
    """Chance that a given step is slowed (seeded per rank): 1.0 = every step (a persistently
    slower device), below 1 = a transient straggler. Drawn only when ``factor`` > 1: set with
    ``factor`` 1 it is a ConfigError."""


WSP_ONLY = ("staleness", "wave_steps", "virtual_workers", "num_virtual_workers", "slowdown", "emulate_speeds",
            "replay")
"""The fields of :class:`AsyncTrainConfig` that only ``mode: wsp`` reads (neo/async_train/wsp.py,
``WSPTrainer``); the synchronous trainer reads ``mode`` alone. Set away from its default under
``bsp``, each is a ConfigError."""


@dataclass
class AsyncTrainConfig:
    """Synchronization of the workers: bulk synchronous or wave synchronous parallel."""

    mode: str = "bsp"
    """``bsp`` (synchronous, :class:`neo.train.trainer.Trainer`) or ``wsp`` (bounded staleness,
    :class:`neo.async_train.WSPTrainer`)."""
    staleness: int = 0
    """WSP: how many waves a worker may run ahead of the slowest one (0: lock-step, equal to
    synchronous training)."""
    wave_steps: int = 1
    """WSP: local steps per wave; their gradients are accumulated and pushed once, at the wave's end."""
    virtual_workers: List[List[int]] = field(default_factory=list)
    """WSP: the ranks of each virtual worker (its ranks run their waves in lock-step), e.g.
    ``[[0, 1], [2, 3]]``; every rank in exactly one. Empty: ``num_virtual_workers`` groups, or
    one worker per rank."""
    num_virtual_workers: int = 0
    """WSP: group the ranks into this many virtual workers of balanced total speed
    (``topology.devices`` speeds, :func:`neo.async_train.group_virtual_workers`); 0: one per
    rank (or ``virtual_workers``)."""
    slowdown: List[SlowdownEntry] = field(default_factory=list)
    """WSP: ranks made slower on purpose (heterogeneous devices emulated on one CPU host)."""
    emulate_speeds: bool = False
    """WSP: slow every rank down to its ``topology.devices`` speed (factor = fastest speed / its speed)."""
    replay: str = ""
    """WSP: the run directory (or its ``metrics.jsonl``) of an earlier run of this config whose
    schedule to follow: every wave computes on the version the recorded run's did, reproducing
    its training bit for bit (:mod:`neo.async_train.replay`). Empty: the run's own timing decides.
    Not this run's own ``train.run_dir`` (whose log a new run moves aside)."""

    def validate(self, where: str = "async_train") -> None:
        self.mode = choice(self.mode, [m.value for m in AsyncMode], f"{where}.mode")
        if self.staleness < 0:
            raise ConfigError(f"{where}.staleness: must be >= 0 (waves a worker may run ahead), got {self.staleness}")
        if self.wave_steps < 1:
            raise ConfigError(f"{where}.wave_steps: must be >= 1 (local steps per wave), got {self.wave_steps}")
        if self.num_virtual_workers < 0:
            raise ConfigError(f"{where}.num_virtual_workers: must be >= 0, got {self.num_virtual_workers}")
        if self.virtual_workers and self.num_virtual_workers:
            raise ConfigError(f"{where}.virtual_workers: give either virtual_workers or num_virtual_workers, not both")
        seen = {}
        for k, ranks in enumerate(self.virtual_workers):
            if not ranks:
                raise ConfigError(f"{where}.virtual_workers[{k}]: a virtual worker with no device (give it >= 1 rank)")
            for r in ranks:
                if r < 0:
                    raise ConfigError(f"{where}.virtual_workers[{k}]: rank {r} is negative")
                if r in seen:
                    raise ConfigError(f"{where}.virtual_workers[{k}]: rank {r} is already in virtual_workers[{seen[r]}]")
                seen[r] = k
        first: dict = {}
        for k, s in enumerate(self.slowdown):
            w = f"{where}.slowdown[{k}]"
            if s.rank < 0:
                raise ConfigError(f"{w}.rank: must be >= 0, got {s.rank}")
            if s.rank in first:
                raise ConfigError(f"{w}.rank: rank {s.rank} already has slowdown[{first[s.rank]}] (one entry a rank)")
            first[s.rank] = k
            if not (math.isfinite(s.factor) and s.factor >= 1):
                raise ConfigError(f"{w}.factor: must be a finite number >= 1, got {s.factor!r}")
            if not 0 <= s.probability <= 1:
                raise ConfigError(f"{w}.probability: must be in [0, 1], got {s.probability!r}")
        self._check_acting(where)

    def _check_acting(self, where: str) -> None:
        """A field set (away from its default) where the mode never reads it is a ConfigError:
        the user would believe it acts."""
        if self.mode != AsyncMode.WSP.value:
            for name in WSP_ONLY:
                value = getattr(self, name)
                if value != field_default(AsyncTrainConfig, name):
                    raise ConfigError(f"{where}.{name}: {_show(value)} has no effect with mode {self.mode} (the "
                                      f"synchronous trainer reads only {where}.mode; {name} acts under mode wsp): "
                                      f"remove it, or set {where}.mode: wsp")
        for k, s in enumerate(self.slowdown):
            if not s.factor > 1 and s.probability != field_default(SlowdownEntry, "probability"):
                w = f"{where}.slowdown[{k}]"
                raise ConfigError(f"{w}.probability: {_show(s.probability)} has no effect with factor "
                                  f"{_show(s.factor)} (only a slowed step, factor > 1, is drawn with it): remove it, "
                                  f"or set {w}.factor above 1")

    def worker_groups(self, world_size: int, speeds: Optional[List[float]] = None) -> List[List[int]]:
        """The ranks of every virtual worker for ``world_size`` ranks (``speeds``: per rank, for
        ``num_virtual_workers``). ConfigError naming the field when they do not cover the ranks."""
        where = "async_train"
        if self.num_virtual_workers:
            from neo.async_train.virtual_workers import group_virtual_workers

            if self.num_virtual_workers > world_size:
                raise ConfigError(f"{where}.num_virtual_workers: {self.num_virtual_workers} virtual workers for "
                                  f"{world_size} ranks: a virtual worker with no device")
            return group_virtual_workers(list(speeds or [1.0] * world_size), self.num_virtual_workers)
        if not self.virtual_workers:
            return [[r] for r in range(world_size)]
        ranks = sorted(r for g in self.virtual_workers for r in g)
        if ranks != list(range(world_size)):
            outside = [r for r in ranks if r >= world_size]
            missing = sorted(set(range(world_size)) - set(ranks))
            raise ConfigError(f"{where}.virtual_workers: must hold every rank of the {world_size} exactly once"
                              f"{f'; out of range: {outside}' if outside else ''}"
                              f"{f'; missing: {missing}' if missing else ''}")
        return [list(g) for g in self.virtual_workers]

    def slowdown_of(self, rank: int, speeds: Optional[List[float]] = None,
                    world_size: Optional[int] = None) -> SlowdownEntry:
        """This rank's slowdown: its ``slowdown`` entry, or its emulated device speed, or none.
        With ``world_size``, an entry for a rank outside the world is a ConfigError (it would
        emulate nothing)."""
        if world_size is not None:
            for k, s in enumerate(self.slowdown):
                if s.rank >= world_size:
                    raise ConfigError(f"async_train.slowdown[{k}].rank: {s.rank} is outside the {world_size} "
                                      f"rank(s) of this run: it would slow nothing down")
        if self.emulate_speeds and (not speeds or len(set(speeds)) == 1):
            raise ConfigError("async_train.emulate_speeds: true, but topology.devices gives every rank the same "
                              "speed: it would slow nothing down; give the ranks their speeds in topology.devices, "
                              "or remove it")
        for s in self.slowdown:
            if s.rank == rank:
                return s
        if self.emulate_speeds and speeds:
            return SlowdownEntry(rank, max(speeds) / speeds[rank], 1.0)
        return SlowdownEntry(rank, 1.0, 1.0)


def _show(value: Any) -> str:
    """``value`` as YAML (flow style) would write it: ``true``, ``[[0, 1], [2]]``, ``[{"rank": 1, ...}]``."""
    return json.dumps([asdict(v) if is_dataclass(v) else v for v in value] if isinstance(value, list) else value,
                      default=str)
