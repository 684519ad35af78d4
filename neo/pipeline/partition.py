"""PipeDream's partitioner: contiguous stages of a layer profile with the optimal bottleneck.

Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019,
section 3.1. The layers (a profile, :func:`load_profile`) are split into ``stages`` contiguous,
non-empty runs; the time of the slowest stage (the bottleneck, which sets the pipeline's
steady-state rate) is minimised exactly by dynamic programming over (stage, last layer, devices).

Stage model, layers ``i..j`` on stage ``s`` replicated ``r`` times (``r = 1`` without ``devices``)::

    T(i..j, s, r) = ( sum_{l=i..j} (fwd_ms_l + bwd_ms_l) / speed_s          compute on stage s's device
                      + 2 * activation_bytes_j / bandwidth   (j < L - 1)  activation out, gradient back
                      + 4 (r - 1) / r * sum_{l=i..j} param_bytes_l / bandwidth ) / r   weight sync

bandwidth in GB/s (1e9 bytes/s), so ``ms = bytes / (G * 1e9) * 1e3``. The weight-sync term is
PipeDream's ``W^m_l = 4 (m - 1) |w_l| / (m B)``; the 1/r of the whole stage is PipeDream's: the r
replicas take micro-batches in turn. The paper's equation takes the max of compute and sync
(perfect overlap); its reference optimizer (msr-fiddle/pipedream,
``optimizer/optimizer_graph_hierarchical.py``) adds them, as here. With ``devices`` the replica
counts are chosen too, summing to ``devices``.

Pure Python and numpy: no torch, no process group.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["LayerProfile", "Profile", "Partition", "PartitionError", "load_profile", "profile_from_dict",
           "partition", "stage_time_ms", "LAYER_FIELDS"]

LAYER_FIELDS = ("name", "fwd_ms", "bwd_ms", "activation_bytes", "param_bytes")


class PartitionError(ValueError):
    """A bad profile or partition request; ``field`` names the culprit (``stages``,
    ``layers[3].fwd_ms``), ``detail`` says what is wrong."""

    def __init__(self, field: str, detail: str):
        super().__init__(f"{field}: {detail}")
        self.field, self.detail = field, detail


@dataclass(frozen=True)
class LayerProfile:
    """One dense layer measured at the profile's batch size."""

    name: str
    """The layer's name (:mod:`neo.pipeline.layers`: ``bottom.0``, ``interaction``, ``top.2``)."""
    fwd_ms: float
    """Forward time, ms."""
    bwd_ms: float
    """Backward time (input and weight gradients), ms."""
    activation_bytes: int
    """Bytes of the layer's output tuple: what a stage ending here sends (and its gradient receives)."""
    param_bytes: int
    """Bytes of the layer's parameters (what a replicated stage AllReduces)."""


@dataclass(frozen=True)
class Profile:
    """A layer profile: ``{"layers": [{name, fwd_ms, bwd_ms, activation_bytes, param_bytes}], "bandwidth_gbps": G}``."""

    layers: Tuple[LayerProfile, ...]
    """The dense layers in forward order."""
    bandwidth_gbps: Optional[float] = None
    """Point-to-point bandwidth between stages, GB/s (1e9 bytes/s); None: the caller gives one."""
    meta: dict = field(default_factory=dict)
    """Everything else the file holds (batch size, device, where the bandwidth comes from)."""

    def to_dict(self) -> dict:
        return {**self.meta, "layers": [asdict(l) for l in self.layers], "bandwidth_gbps": self.bandwidth_gbps}


def _number(value: Any, where: str, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise PartitionError(where, f"expected {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise PartitionError(where, f"must be a finite number >= 0, got {value!r}")
    return int(value) if integer else float(value)


def profile_from_dict(data: Any) -> Profile:
    """Validate a parsed profile; errors name the field (``layers[2].bwd_ms``)."""
    if not isinstance(data, dict):
        raise PartitionError("profile", f"expected a JSON object, got {type(data).__name__}")
    if "layers" not in data:
        raise PartitionError("profile", "missing field 'layers'")
    rows = data["layers"]
    if not isinstance(rows, list) or not rows:
        raise PartitionError("layers", "must be a non-empty list of layers")
    layers = []
    for k, row in enumerate(rows):
        where = f"layers[{k}]"
        if not isinstance(row, dict):
            raise PartitionError(where, f"expected an object, got {type(row).__name__}")
        missing = [f for f in LAYER_FIELDS if f not in row]
        if missing:
            raise PartitionError(where, f"missing field {missing[0]!r} (a layer has {list(LAYER_FIELDS)})")
        layers.append(LayerProfile(str(row["name"]), _number(row["fwd_ms"], f"{where}.fwd_ms"),
                                   _number(row["bwd_ms"], f"{where}.bwd_ms"),
                                   _number(row["activation_bytes"], f"{where}.activation_bytes", True),
                                   _number(row["param_bytes"], f"{where}.param_bytes", True)))
    bw = data.get("bandwidth_gbps")
    if bw is not None:
        bw = _number(bw, "bandwidth_gbps")
        if bw <= 0:
            raise PartitionError("bandwidth_gbps", f"must be > 0, got {bw!r}")
    meta = {k: v for k, v in data.items() if k not in ("layers", "bandwidth_gbps")}
    return Profile(tuple(layers), bw, meta)


def load_profile(path: str) -> Profile:
    """Read and validate a profile JSON file (``neo profile-layers --out``)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise PartitionError("profile", f"{path!r}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PartitionError("profile", f"{path!r} is not valid JSON ({e})") from None
    return profile_from_dict(data)


@dataclass
class Partition:
    """Contiguous stages of a profile and their modelled times (ms per step at the profile's batch)."""

    stages: List[Tuple[int, int]]
    """``[first, last]`` layer indices of each stage, inclusive, in order."""
    stage_ms: List[float]
    """Each stage's time T (module docstring)."""
    bottleneck_ms: float
    """The largest stage time: minimal over all contiguous splits."""
    replicas: List[int]
    """Devices of each stage (all 1 without ``devices``); they sum to ``devices``."""

    def to_dict(self) -> dict:
        return {"stages": [list(s) for s in self.stages], "stage_ms": self.stage_ms,
                "bottleneck_ms": self.bottleneck_ms, "replicas": self.replicas}


def stage_time_ms(profile: Profile, first: int, last: int, bandwidth_gbps: float, replicas: int = 1,
                  speed: float = 1.0) -> float:
    """T(first..last) of the module docstring, summed directly (the reference the DP is tested against)."""
    layers = profile.layers[first:last + 1]
    per_ms = 1.0 / (bandwidth_gbps * 1e6)                   # ms per byte
    t = sum(l.fwd_ms + l.bwd_ms for l in layers) / speed
    if last < len(profile.layers) - 1:
        t += 2 * layers[-1].activation_bytes * per_ms
    if replicas > 1:
        t += 4 * (replicas - 1) / replicas * sum(l.param_bytes for l in layers) * per_ms
    return t / replicas


def _check(profile: Profile, stages: Any, bandwidth_gbps: Optional[float], devices: Optional[int],
           speeds: Optional[Sequence[float]]) -> Tuple[float, int, List[float]]:
    L = len(profile.layers)
    if isinstance(stages, bool) or not isinstance(stages, int):
        raise PartitionError("stages", f"must be an integer, got {stages!r}")
    if stages < 1:
        raise PartitionError("stages", f"must be >= 1, got {stages}")
    if stages > L:
        raise PartitionError("stages", f"{stages} exceeds the profile's {L} layers")
    n = stages if devices is None else devices
    if isinstance(n, bool) or not isinstance(n, int):
        raise PartitionError("devices", f"must be an integer, got {n!r}")
    if n < stages:
        raise PartitionError("devices", f"{n} is fewer than the {stages} stages (each stage needs a device)")
    bw = profile.bandwidth_gbps if bandwidth_gbps is None else bandwidth_gbps
    if bw is None:
        if stages > 1 or n > stages:
            raise PartitionError("bandwidth_gbps", "needed (the profile has none)")
        bw = 1.0                                            # unused: one stage, one device
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw) or bw <= 0:
        raise PartitionError("bandwidth_gbps", f"must be a finite number > 0, got {bw!r}")
    sp = [1.0] * stages if speeds is None else list(speeds)
    if len(sp) != stages:
        raise PartitionError("speeds", f"needs one speed per stage ({stages}), got {len(sp)}")
    for k, v in enumerate(sp):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise PartitionError(f"speeds[{k}]", f"must be a finite number > 0, got {v!r}")
    return float(bw), n, [float(v) for v in sp]


def partition(profile: Profile, stages: int, bandwidth_gbps: Optional[float] = None,
              devices: Optional[int] = None, speeds: Optional[Sequence[float]] = None) -> Partition:
    """The contiguous split of ``profile.layers`` into ``stages`` stages with the least bottleneck.

    Args:
        profile: the layers (:func:`load_profile`).
        stages: S, the number of stages (1 <= S <= layers).
        bandwidth_gbps: point-to-point bandwidth, GB/s; default the profile's.
        devices: N >= S devices: stage s gets ``replicas[s]`` of them (PipeDream's replicated
            stages), summing to N. Default: one device per stage.
        speeds: per stage, the relative speed of its device (compute times scale by 1 / speed;
            transfers do not); default all 1 (heterogeneous devices, a later issue's need).

    The DP: ``A[s][j][m]`` = least bottleneck of layers ``0..j`` on stages ``0..s`` using m devices,
    ``A[s][j][m] = min_{i <= j, r} max(A[s-1][i-1][m-r], T(i..j, s, r))``; each stage's step is
    vectorised over (i, j, m), O(S L^2 N (N - S + 1)) work. Ties go to the earliest boundaries.
    """
    bw, n, sp = _check(profile, stages, bandwidth_gbps, devices, speeds)
    layers = profile.layers
    L, S = len(layers), stages
    R = n - S + 1                                           # most replicas one stage can get
    per_ms = 1.0 / (bw * 1e6)
    work = np.array([l.fwd_ms + l.bwd_ms for l in layers])
    comm = np.array([2 * l.activation_bytes * per_ms for l in layers])
    comm[-1] = 0.0                                          # the last stage sends nothing
    params = np.array([float(l.param_bytes) for l in layers])
    P = np.concatenate([[0.0], np.cumsum(work)])
    Q = np.concatenate([[0.0], np.cumsum(params)])
    ii, jj = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    valid = ii <= jj
    span_work = np.where(valid, P[jj + 1] - P[ii], np.inf)             # (L_i, L_j)
    span_sync = np.where(valid, (Q[jj + 1] - Q[ii]) * per_ms, 0.0)     # (L_i, L_j), ms at r = 2 before 4(r-1)/r
    inf = np.inf

    def stage_cost(s: int, r: int) -> np.ndarray:           # T(i..j, s, r) as an (L_i, L_j) matrix
        return (span_work / sp[s] + comm[None, :] + 4 * (r - 1) / r * span_sync) / r

    # best[j, m]: least bottleneck of layers 0..j on the stages so far with m devices.
    best = np.full((L, n + 1), inf)
    for r in range(1, R + 1):
        best[:, r] = stage_cost(0, r)[0]
    choices: List[Tuple[np.ndarray, np.ndarray]] = []
    for s in range(1, S):
        prev = np.full((L, n + 1), inf)                     # prev[i, m] = best[i-1, m]: stage s starts at i
        prev[1:] = best[:-1]
        new = np.full((L, n + 1), inf)
        arg_i = np.zeros((L, n + 1), dtype=np.int64)
        arg_r = np.ones((L, n + 1), dtype=np.int64)
        for r in range(1, R + 1):
            shifted = np.full((L, n + 1), inf)              # shifted[i, m] = prev[i, m - r]
            shifted[:, r:] = prev[:, :n + 1 - r]
            cand = np.maximum(shifted[:, None, :], stage_cost(s, r)[:, :, None])   # (L_i, L_j, m)
            i_best = np.argmin(cand, axis=0)                                       # (L_j, m)
            v = np.take_along_axis(cand, i_best[None], axis=0)[0]
            better = v < new
            new = np.where(better, v, new)
            arg_i = np.where(better, i_best, arg_i)
            arg_r = np.where(better, r, arg_r)
        choices.append((arg_i, arg_r))
        best = new
    if not math.isfinite(best[L - 1, n]):
        raise PartitionError("stages", f"no split of {L} layers into {S} stages on {n} devices")

    # Walk the choices back from (last layer, all devices).
    bounds: List[Tuple[int, int]] = []
    reps: List[int] = []
    j, m = L - 1, n
    for s in range(S - 1, 0, -1):
        arg_i, arg_r = choices[s - 1]
        i, r = int(arg_i[j, m]), int(arg_r[j, m])
        bounds.append((i, j))
        reps.append(r)
        j, m = i - 1, m - r
    bounds.append((0, j))
    reps.append(m)
    bounds.reverse()
    reps.reverse()
    stage_ms = [stage_time_ms(profile, a, b, bw, r, sp[s]) for s, ((a, b), r) in enumerate(zip(bounds, reps))]
    return Partition(bounds, stage_ms, max(stage_ms), reps)
