"""DLRM (Naumov et al. 2019) and its DCNv2 variant (MLPerf DLRM-DCNv2), free of distributed code.

    dense (B, 13) --bottom MLP--> (B, D) --+
                                           +--> interaction --> top MLP --> logit (B,)
    sparse batch --embedding--> (B, F*D) --+

The embedding module is any ``nn.Module`` mapping a :class:`~neo.sparse.KeyedJaggedBatch` to
pooled embeddings ``(B, F * D)`` (features of equal dimension D): a
:class:`~neo.embedding.TableBatchedEmbedding` in one process, or a sharded collection once
the model is parallelized. The model never knows which.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from neo.models.interaction import DotInteraction, LowRankCrossNet
from neo.models.mlp import MLP
from neo.sparse import KeyedJaggedBatch


class DLRM(nn.Module):
    """DLRM with ``interaction="dot"`` or DCNv2 with ``interaction="dcn"``.

    Args:
        embedding: pooled lookup of F features of dimension ``embedding_dim`` each.
        num_features: F.
        embedding_dim: D; the bottom MLP's last size must equal it.
        dense_in_features: dense input features (13 for Criteo).
        bottom_mlp: sizes of the bottom MLP, e.g. ``[512, 256, 64]``.
        top_mlp: sizes of the top MLP, ending in 1, e.g. ``[512, 256, 1]``.
        interaction: ``"dot"`` (pairwise dot products) or ``"dcn"`` (low-rank cross network).
        dcn_layers, dcn_rank: cross layers and their rank (``"dcn"`` only).
        position_weights: a module giving the sparse batch its per-id weights before the lookup
            (:class:`~neo.embedding.PositionWeights`), or None. An embedding with a ``weight_table``
            (a sharded collection) is given it as that instead, and weighs each batch when it looks
            it up (exact under a pipelined loop).
    """

    def __init__(
        self,
        embedding: nn.Module,
        num_features: int,
        embedding_dim: int,
        dense_in_features: int,
        bottom_mlp: Sequence[int],
        top_mlp: Sequence[int],
        interaction: str = "dot",
        dcn_layers: int = 3,
        dcn_rank: int = 512,
        position_weights: Optional[nn.Module] = None,
    ):
        super().__init__()
        if bottom_mlp[-1] != embedding_dim:
            raise ValueError(f"model.bottom_mlp must end in the embedding dimension {embedding_dim}, got {list(bottom_mlp)}")
        if top_mlp[-1] != 1:
            raise ValueError(f"model.top_mlp must end in 1 (one logit), got {list(top_mlp)}")
        self.embedding = embedding
        self.position_weights = position_weights
        if position_weights is not None and hasattr(embedding, "weight_table"):
            embedding.weight_table = position_weights
        self.bottom = MLP(dense_in_features, bottom_mlp)
        if interaction == "dot":
            self.interaction = DotInteraction(num_features, embedding_dim)
        elif interaction == "dcn":
            self.interaction = LowRankCrossNet(embedding_dim * (num_features + 1), dcn_layers, dcn_rank)
        else:
            raise ValueError(f"model.interaction must be one of ['dot', 'dcn'], got {interaction!r}")
        self.top = MLP(self.interaction.out_features, top_mlp, final_activation=False)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedBatch) -> torch.Tensor:
        if self.position_weights is not None and getattr(self.embedding, "weight_table", None) is None:
            sparse = self.position_weights(sparse)         # per-id weights by position in the bag
        pooled = self.embedding(sparse)                    # (B, F * D)
        return self.head(dense, pooled)

    def head(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Everything after the embedding lookup: logits ``(B,)``."""
        x = self.bottom(dense)                             # (B, D)
        z = self.interaction(x, pooled)                    # (B, interaction.out_features)
        return self.top(z).squeeze(1)                      # (B,)
