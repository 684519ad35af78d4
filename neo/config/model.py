"""The ``model`` section of Neo's YAML config: DLRM (dot interaction) or DCNv2 (low-rank cross).

Example (MLPerf DLRM-DCNv2)::

    model:
      interaction: dcn          # dot | dcn
      dense_arch: [512, 256, 128]   # bottom MLP; ends in the tables' dim D
      over_arch: [1024, 1024, 512, 256, 1]   # top MLP; ends in 1 (the logit)
      dcn_layers: 3
      dcn_rank: 512
      position_weights: {clicks: 50}   # optional: learnable weights by position in the bag

The embedding tables themselves are the ``tables`` section; every feature's dimension must
be equal (DLRM stacks the F pooled vectors and the bottom MLP output as F + 1 vectors of D).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

from neo.config.embedding import ConfigError, choice

__all__ = ["Interaction", "ModelConfig"]


class Interaction(str, enum.Enum):
    """How the dense vector and the pooled embeddings interact."""

    DOT = "dot"
    """Pairwise dot products (DLRM, Naumov et al. 2019)."""
    DCN = "dcn"
    """Low-rank cross network (DCNv2, Wang et al. 2021; MLPerf DLRM-DCNv2)."""


@dataclass
class ModelConfig:
    """DLRM / DCNv2 architecture."""

    interaction: str = "dot"
    """Feature interaction: ``dot`` (DLRM) or ``dcn`` (DCNv2 low-rank cross layers)."""
    dense_arch: List[int] = field(default_factory=lambda: [64, 16])
    """Bottom MLP layer sizes applied to the dense features; the last must equal the tables' dim."""
    over_arch: List[int] = field(default_factory=lambda: [64, 1])
    """Top MLP layer sizes applied to the interaction output; the last must be 1 (the logit)."""
    dcn_layers: int = 3
    """Cross layers of the DCNv2 interaction (``interaction: dcn`` only)."""
    dcn_rank: int = 512
    """Rank of each cross layer's low-rank weight U V (``interaction: dcn`` only)."""
    position_weights: Dict[str, int] = field(default_factory=dict)
    """Learnable per-id weights by position in the bag (TorchRec's position-weighted features):
    feature name -> the longest bag it may have (:class:`neo.embedding.PositionWeights`, trained
    with the dense model; a longer bag raises naming the feature). Empty: unweighted sums."""

    def validate(self, where: str = "model") -> None:
        """Raise :class:`ConfigError` naming the field and the valid values."""
        self.interaction = choice(self.interaction, [m.value for m in Interaction], f"{where}.interaction")
        for name in ("dense_arch", "over_arch"):
            sizes = getattr(self, name)
            if not sizes or any(int(s) <= 0 for s in sizes):
                raise ConfigError(f"{where}.{name}: must be a non-empty list of positive sizes, got {list(sizes)}")
        if int(self.over_arch[-1]) != 1:
            raise ConfigError(f"{where}.over_arch: must end in 1 (one logit), got {list(self.over_arch)}")
        for name in ("dcn_layers", "dcn_rank"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"{where}.{name}: must be a positive integer, got {getattr(self, name)!r}")
        for f, n in self.position_weights.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ConfigError(f"{where}.position_weights.{f}: must be the longest bag of the feature, an "
                                  f"integer >= 1, got {n!r}")

    def check_features(self, features: Sequence[str], where: str = "model") -> None:
        """Cross-section rule: ``position_weights`` names features of the tables."""
        unknown = [f for f in self.position_weights if f not in features]
        if unknown:
            raise ConfigError(f"{where}.position_weights.{unknown[0]}: no table has that feature; features: "
                              f"{list(features)}")

    def check_tables(self, dims: Sequence[int], where: str = "model") -> None:
        """Cross-section rule: every feature has the same dim D and ``dense_arch`` ends in D."""
        if len(set(dims)) != 1:
            raise ConfigError(f"tables: DLRM needs every table's dim equal, got dims {sorted(set(dims))}")
        if int(self.dense_arch[-1]) != dims[0]:
            raise ConfigError(f"{where}.dense_arch: must end in the tables' dim {dims[0]} "
                              f"(the bottom MLP output is interacted with the embeddings), got {list(self.dense_arch)}")
