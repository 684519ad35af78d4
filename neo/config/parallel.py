"""The ``parallel`` section of Neo's YAML config: pipeline parallelism of the dense towers.

Example (a deep top MLP over 4 ranks: 2 pipeline stages x 2 data-parallel replicas)::

    parallel:
      pipeline:
        stages: 2                # ranks per pipeline; world size 4 -> 2 replicas of the pipeline
        schedule: 1f1b           # gpipe | 1f1b | interleaved_1f1b | zero_bubble | chimera | auto
                                 # | pipedream_async | pipedream_2bw (asynchronous: docs/pipeline.md)
        micro_batches: 4         # per step and pipeline replica; divides stages x train.batch_size
        split: auto              # or [[0, 3], [4, 9]]: first and last layer of every stage
        virtual_stages: 1        # model chunks per rank (interleaved_1f1b: 2 or more)

The embeddings stay sharded over every rank; only the dense layers after the lookup (bottom
MLP + interaction, cross layers, top MLP) are cut into stages. See docs/pipeline.md.
``stages: 1`` (the default) is plain data parallelism of the dense part.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, List, Optional

from neo.config.embedding import ConfigError, choice, field_default

__all__ = ["PipelineSchedule", "PipelineConfig", "ParallelConfig"]


class PipelineSchedule(str, enum.Enum):
    """The order in which a pipeline runs the forward and backward of its micro-batches."""

    GPIPE = "gpipe"
    """All forwards, then all backwards (Huang et al. 2019): torch's ScheduleGPipe."""
    ONE_F_ONE_B = "1f1b"
    """One forward, one backward in the steady state (PipeDream-flush, Narayanan et al. 2021): Schedule1F1B."""
    INTERLEAVED_1F1B = "interleaved_1f1b"
    """1F1B over ``virtual_stages`` >= 2 model chunks per rank (Megatron-LM, Narayanan et al. 2021):
    ScheduleInterleaved1F1B."""
    ZERO_BUBBLE = "zero_bubble"
    """Backward split into input and weight gradients, weight work filling the bubbles (Qi et al.
    2024): ScheduleInterleavedZeroBubble (ZB-1P with one chunk per rank)."""
    CHIMERA = "chimera"
    """Two pipelines in opposite directions, each rank one stage of each (Li and Hoefler 2021):
    Neo's own driver, neo/pipeline/chimera.py."""
    PIPEDREAM_ASYNC = "pipedream_async"
    """1F1B without a flush between micro-batches, each stage updating after every backward and
    stashing the weight version each in-flight micro-batch's forward used (PipeDream, Narayanan et
    al. 2019): neo/pipeline/async_schedules.py. Asynchronous: not single-process training."""
    PIPEDREAM_2BW = "pipedream_2bw"
    """1F1B with two weight buffers: gradients accumulated over a mini-batch, one new version per
    mini-batch, micro-batches of mini-batch k computing on version k-1 (PipeDream-2BW, Narayanan
    et al. 2021): neo/pipeline/async_schedules.py. Asynchronous."""
    AUTO = "auto"
    """The schedule the performance model predicts fastest (neo/pipeline/perf_model.py)."""


ASYNC = {PipelineSchedule.PIPEDREAM_ASYNC.value, PipelineSchedule.PIPEDREAM_2BW.value}
"""Asynchronous schedules: weight versions differ across the micro-batches of a step."""

SINGLE_CHUNK = {PipelineSchedule.GPIPE.value, PipelineSchedule.ONE_F_ONE_B.value,
                PipelineSchedule.CHIMERA.value} | ASYNC
"""Schedules that run exactly one model chunk per rank and pipeline direction."""


@dataclass
class PipelineConfig:
    """Pipeline parallelism of the dense towers (see the module docstring)."""

    stages: int = 1
    """Ranks per pipeline replica (1: no pipeline). The world size must be a multiple of it; the
    ``world / stages`` replicas are data-parallel."""
    schedule: str = "1f1b"
    """``gpipe`` | ``1f1b`` | ``interleaved_1f1b`` | ``zero_bubble`` | ``chimera`` | ``auto`` (the
    synchronous ones), or ``pipedream_async`` | ``pipedream_2bw`` (asynchronous; ``stages`` > 1)."""
    micro_batches: int = 4
    """Micro-batches per step of one pipeline replica; must divide the replica's batch of
    ``stages x train.batch_size`` samples (chimera: an even number, half in each direction)."""
    split: Any = "auto"
    """``auto`` (the partitioner balances measured layer times) or a list of ``[first, last]``
    layer indices, one pair per model chunk (``stages x virtual_stages`` pairs), contiguous and
    covering every layer of the dense model (neo/pipeline/layers.py numbers them)."""
    virtual_stages: int = 1
    """Model chunks per rank: 1 for gpipe, 1f1b and chimera; 2 or more for interleaved_1f1b;
    any for zero_bubble. Chunk k runs on the pipeline's rank ``k mod stages``."""
    max_versions: Optional[int] = None
    """``pipedream_async`` only: weight versions a stage may keep stashed for micro-batches in
    flight (the staleness bound is ``max_versions - 1``); None: ``stages`` (1F1B's in-flight
    bound, so no extra constraint). 1: every backward before the next forward (no staleness).
    ``pipedream_2bw`` always keeps two. Set with any other schedule (``auto`` included, which
    never chooses an asynchronous one) it would do nothing: a ConfigError."""

    @property
    def enabled(self) -> bool:
        return int(self.stages) > 1

    @property
    def chunks(self) -> int:
        """Model chunks of one pipeline: ``stages x virtual_stages``."""
        return int(self.stages) * int(self.virtual_stages)

    def validate(self, where: str = "parallel.pipeline") -> None:
        """Rules inside the section; :meth:`check` adds those that need the model, batch and world."""
        self.schedule = choice(self.schedule, [s.value for s in PipelineSchedule], f"{where}.schedule")
        for name in ("stages", "micro_batches", "virtual_stages"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{where}.{name}: must be a positive integer, got {getattr(self, name)!r}")
        s, v = self.schedule, int(self.virtual_stages)
        if self.max_versions is not None:
            mv = self.max_versions
            if isinstance(mv, bool) or not isinstance(mv, int) or mv < 1:
                raise ConfigError(f"{where}.max_versions: must be a positive integer (weight versions a stage "
                                  f"keeps in flight) or null for stages, got {mv!r}")
        if s in ASYNC and not self.enabled:
            raise ConfigError(f"{where}.stages: schedule {s} is asynchronous pipeline parallelism and needs "
                              f"2 or more stages, got {self.stages}")
        if s == PipelineSchedule.INTERLEAVED_1F1B.value and v < 2:
            raise ConfigError(f"{where}.virtual_stages: schedule interleaved_1f1b needs 2 or more model chunks "
                              f"per rank, got {v} (use 1f1b for one chunk per rank)")
        if s in SINGLE_CHUNK and v != 1:
            raise ConfigError(f"{where}.virtual_stages: schedule {s} runs one model chunk per rank, got {v} "
                              "(use interleaved_1f1b or zero_bubble for more)")
        if s == PipelineSchedule.CHIMERA.value and self.enabled:
            if int(self.stages) % 2:
                raise ConfigError(f"{where}.stages: schedule chimera pairs stage s with stage stages-1-s on "
                                  f"each rank and needs an even number of stages, got {self.stages}")
            if int(self.micro_batches) % 2:
                raise ConfigError(f"{where}.micro_batches: schedule chimera sends half of the micro-batches "
                                  f"down and half up the pipeline: needs an even number, got {self.micro_batches}")
        if isinstance(self.split, str):
            self.split = choice(self.split, ["auto"], f"{where}.split")
        else:
            self.split = _pairs(self.split, f"{where}.split")
            if len(self.split) != self.chunks:
                raise ConfigError(f"{where}.split: give one [first, last] pair per model chunk "
                                  f"(stages x virtual_stages = {self.chunks}), got {len(self.split)}")
        self._check_acting(where)

    def _check_acting(self, where: str) -> None:
        """A field set (away from its default) where the chosen schedule never reads it is a
        ConfigError: the user would believe it acts. Only ``max_versions`` has such a mode: it is
        read by pipedream_async alone (neo/pipeline/async_schedules.py, ``AsyncPipeline``).

        With ``stages: 1`` no pipeline runs and ``schedule``, ``micro_batches``, ``split`` and
        ``virtual_stages`` are not read either; they are left free on purpose: ``stages: 1`` is
        how a pipelined config (configs/pipeline_*.yaml) is turned off, as the pipeline's own
        errors advise (neo/pipeline/trainer.py)."""
        s, mv = self.schedule, self.max_versions
        if s != PipelineSchedule.PIPEDREAM_ASYNC.value and mv != field_default(PipelineConfig, "max_versions"):
            why = {PipelineSchedule.PIPEDREAM_2BW.value: "pipedream_2bw always keeps two weight versions",
                   PipelineSchedule.AUTO.value: "auto never chooses an asynchronous schedule"}.get(
                       s, f"{s} is synchronous: one weight version")
            raise ConfigError(f"{where}.max_versions: {mv} has no effect with schedule {s} ({why}; only "
                              f"pipedream_async bounds its stashed weight versions with it): remove it, or set "
                              f"{where}.schedule: pipedream_async"
                              f"{'' if self.enabled else f' (with {where}.stages 2 or more)'}")

    def check(self, num_layers: int, batch_size: int, world_size: int, where: str = "parallel.pipeline") -> None:
        """Rules across sections: layers to cut, the replica's batch, the world size."""
        S, M = int(self.stages), int(self.micro_batches)
        if world_size % S:
            raise ConfigError(f"{where}.stages: the world size {world_size} is not a multiple of {S} stages "
                              f"(every pipeline replica needs {S} ranks)")
        if self.chunks > num_layers:
            what = f"{S} stages x {self.virtual_stages} virtual stages" if int(self.virtual_stages) > 1 else f"{S}"
            raise ConfigError(f"{where}.stages: {what} model chunks, but the dense model has only {num_layers} "
                              "layers to cut (deepen model.over_arch or model.dcn_layers, or use fewer stages)")
        replica_batch = S * batch_size
        if replica_batch % M:
            raise ConfigError(f"{where}.micro_batches: {M} does not divide the pipeline replica's batch of "
                              f"{replica_batch} samples (stages {S} x train.batch_size {batch_size})")
        if self.schedule in (PipelineSchedule.INTERLEAVED_1F1B.value, PipelineSchedule.ZERO_BUBBLE.value):
            rounds = max(1, M // S)
            if M % rounds:
                raise ConfigError(f"{where}.micro_batches: schedule {self.schedule} runs micro-batches in rounds "
                                  f"of {S} (the stages): {M} is not a multiple of {rounds} rounds")
        if not isinstance(self.split, str):
            last = self.split[-1][1]
            if self.split[0][0] != 0 or last != num_layers - 1:
                raise ConfigError(f"{where}.split: must cover layers 0 .. {num_layers - 1} of the dense model, "
                                  f"covers {self.split[0][0]} .. {last}")


def _pairs(value: Any, where: str) -> List[List[int]]:
    """``[[first, last], ...]`` checked: integers, first <= last, each starting after the previous."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{where}: expected 'auto' or a non-empty list of [first, last] pairs, got {value!r}")
    out: List[List[int]] = []
    prev: Optional[int] = None
    for k, pair in enumerate(value):
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
            raise ConfigError(f"{where}[{k}]: expected [first, last] layer indices, got {pair!r}")
        a, b = int(pair[0]), int(pair[1])
        if a > b:
            raise ConfigError(f"{where}[{k}]: first layer {a} is after last layer {b}")
        if prev is not None and a != prev + 1:
            raise ConfigError(f"{where}[{k}]: stage starts at layer {a}, expected {prev + 1} (stages are "
                              "contiguous runs of layers, in order)")
        out.append([a, b])
        prev = b
    return out


@dataclass
class ParallelConfig:
    """Parallelism of the dense part beyond data parallelism (the embeddings' is the plan's)."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """Pipeline parallelism of the dense towers (see :class:`PipelineConfig`)."""

    def validate(self, where: str = "parallel") -> None:
        self.pipeline.validate(f"{where}.pipeline")
