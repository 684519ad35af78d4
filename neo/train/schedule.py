"""Learning-rate schedule: linear warmup, constant, then polynomial decay (as MLPerf's DLRM).

    lr(step) = base * (step + 1) / warmup_steps              step <  warmup_steps
             = base                                           step <  decay_start
             = base * max(end_ratio, (1 - p) ** power)       p = (step - decay_start) / decay_steps, capped at 1
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LRSchedule:
    base_lr: float
    warmup_steps: int = 0
    decay_start: int = 0
    decay_steps: int = 0
    power: float = 2.0
    end_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        if self.decay_steps <= 0 or step < max(self.decay_start, self.warmup_steps):
            return self.base_lr
        p = min(1.0, (step - self.decay_start) / self.decay_steps)
        return self.base_lr * max(self.end_ratio, (1.0 - p) ** self.power)

    def factor(self, step: int) -> float:
        """The schedule at ``step`` as a fraction of ``base_lr``: what the tables' own learning
        rates are multiplied by (``lr(step) / base_lr``, computed so where ``base_lr`` is 0 too)."""
        if self.base_lr > 0:
            return self(step) / self.base_lr
        return LRSchedule(1.0, self.warmup_steps, self.decay_start, self.decay_steps, self.power, self.end_ratio)(step)
