"""Multi-layer perceptron: the bottom and top towers of DLRM."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class MLP(nn.Sequential):
    """``Linear -> ReLU`` for every layer of ``sizes``; the last layer's ReLU is optional.

    ``MLP(13, [512, 256, 64])`` maps ``(B, 13)`` to ``(B, 64)``.
    """

    def __init__(self, in_features: int, sizes: Sequence[int], final_activation: bool = True):
        if not sizes:
            raise ValueError("an MLP needs at least one layer size")
        layers = []
        prev = in_features
        for i, size in enumerate(sizes):
            layers.append(nn.Linear(prev, size))
            if i < len(sizes) - 1 or final_activation:
                layers.append(nn.ReLU())
            prev = size
        super().__init__(*layers)
        self.out_features = prev
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DLRM's initialisation: weights N(0, sqrt(2 / (fan_in + fan_out))), biases N(0, sqrt(1 / fan_out))."""
        for m in self:
            if isinstance(m, nn.Linear):
                fan_out, fan_in = m.weight.shape
                nn.init.normal_(m.weight, 0.0, (2.0 / (fan_in + fan_out)) ** 0.5)
                nn.init.normal_(m.bias, 0.0, (1.0 / fan_out) ** 0.5)
