"""The synthetic generator's options that ``neo train``'s ``data.synthetic`` config section shares
(:class:`neo.config.data.SyntheticDataConfig`), in a module of their own: the config imports them
without the generator's numpy and pyarrow."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

__all__ = ["SynthKnobs"]


@dataclass(kw_only=True)
class SynthKnobs:
    """The generator options that also make up ``neo train``'s ``data.synthetic`` config section
    (:class:`neo.config.data.SyntheticDataConfig`): how samples look and what the teacher plants."""

    num_dense: int = 13
    """Dense features per sample."""
    ids_per_bag: List[int] = field(default_factory=lambda: [1])
    """Ids per bag, one value for all tables or one per table."""
    variable_bags: bool = False
    """Bag sizes uniform in [0, 2k] (mean k, empty bags included) instead of exactly k."""
    distribution: str = "zipf"
    """``uniform`` or ``zipf`` (P(rank r) ~ (r+1)^-skew, ranks spread by a seeded permutation)."""
    skew: List[float] = field(default_factory=lambda: [1.05])
    """Zipf exponent, one value for all tables or one per table (0 = uniform)."""
    seed: int = 0
    """Seed of everything (teacher, ids, labels)."""
    base_ctr: float = 0.25
    """Approximate positive rate (sets the teacher's bias)."""
    dense_strength: float = 1.0
    """Standard deviation of the dense part of the teacher's score."""
    sparse_strength: float = 1.0
    """Standard deviation of the sparse part of the teacher's score (about)."""
