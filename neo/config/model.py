"""The ``model`` section of Neo's YAML config: DLRM (dot interaction) or DCNv2 (low-rank cross).

Example (MLPerf DLRM-DCNv2)::

    model:
      interaction: dcn          # dot | dcn
      dense_arch: [512, 256, 128]   # bottom MLP; ends in the tables' dim D
      over_arch: [1024, 1024, 512, 256, 1]   # top MLP; ends in 1 (the logit)
      dcn_layers: 3
      dcn_rank: 512

The embedding tables themselves are the ``tables`` section; every feature's dimension must
be equal (DLRM stacks the F pooled vectors and the bottom MLP output as F + 1 vectors of D).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List, Sequence

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

    def check_tables(self, dims: Sequence[int], where: str = "model") -> None:
        """Cross-section rule: every feature has the same dim D and ``dense_arch`` ends in D."""
        if len(set(dims)) != 1:
            raise ConfigError(f"tables: DLRM needs every table's dim equal, got dims {sorted(set(dims))}")
        if int(self.dense_arch[-1]) != dims[0]:
            raise ConfigError(f"{where}.dense_arch: must end in the tables' dim {dims[0]} "
                              f"(the bottom MLP output is interacted with the embeddings), got {list(self.dense_arch)}")
