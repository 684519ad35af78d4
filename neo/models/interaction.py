"""Feature interactions: DLRM's pairwise dot products and DCNv2's low-rank cross layers."""

from __future__ import annotations

import torch
from torch import nn


class DotInteraction(nn.Module):
    """Pairwise dot products of the dense vector and the F pooled embeddings (DLRM, Naumov et al. 2019).

    Input: dense ``(B, D)`` and pooled ``(B, F * D)``. The F + 1 vectors of a sample are
    dotted pairwise (each unordered pair once, no self-products) and appended to the dense
    vector: output ``(B, D + (F + 1) * F / 2)``.
    """

    def __init__(self, num_features: int, dim: int):
        super().__init__()
        self.num_features, self.dim = num_features, dim
        n = num_features + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.out_features = dim + rows.numel()

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        B = dense.shape[0]
        vectors = torch.cat([dense.unsqueeze(1), pooled.view(B, self.num_features, self.dim)], dim=1)  # (B, F+1, D)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))                                             # (B, F+1, F+1)
        pairs = gram[:, self.rows, self.cols]                                                          # (B, (F+1)F/2)
        return torch.cat([dense, pairs], dim=1)


class LowRankCrossNet(nn.Module):
    """DCNv2's cross network with low-rank weights (Wang et al. 2021, eq. 1 with ``W = U V``).

    ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l`` for ``num_layers`` layers, ``U_l`` of shape
    ``(N, r)``, ``V_l`` of shape ``(r, N)``; as in MLPerf's DLRM-DCNv2 (3 layers, rank 512).
    The input is the dense vector and the pooled embeddings side by side: ``(B, N)``, ``N = D + F * D``.
    """

    def __init__(self, in_features: int, num_layers: int = 3, low_rank: int = 512):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(in_features, low_rank, bias=False) for _ in range(num_layers))
        self.up = nn.ModuleList(nn.Linear(low_rank, in_features, bias=True) for _ in range(num_layers))
        for lin in list(self.down) + list(self.up):
            nn.init.xavier_normal_(lin.weight)
        for lin in self.up:
            nn.init.zeros_(lin.bias)
        self.out_features = in_features

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([dense, pooled], dim=1)                                                          # (B, N)
        x = x0
        for down, up in zip(self.down, self.up):
            x = x0 * up(down(x)) + x                                                                     # (B, N)
        return x
