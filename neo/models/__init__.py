"""Models: MLPs, interactions, DLRM and DCNv2. No distributed code lives here."""

from neo.models.dlrm import DLRM  # noqa: F401
from neo.models.interaction import DotInteraction, LowRankCrossNet, PooledPieces, as_tensor  # noqa: F401
from neo.models.mlp import MLP  # noqa: F401
