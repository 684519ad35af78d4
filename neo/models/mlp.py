"""Multi-layer perceptron: the bottom and top towers of DLRM."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
from torch import nn


class _LinearFn(torch.autograd.Function):
    """``x W^T + b`` with the weight gradient's product oriented for speed.

    ``dW = g^T x`` (out x in) is computed as ``(x^T g)^T`` when the layer widens
    (in < out): on one CPU thread MKL runs the (13, 2048) x (2048, 512) product of DLRM's
    first bottom layer 2.7x faster than (512, 2048) x (2048, 13), and 415 -> 512 5% faster;
    the other layers keep ``g^T x``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.addmm(bias, x, weight.t())                                   # (B, out)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = g @ weight if ctx.needs_input_grad[0] else None                  # (B, in)
        if weight.shape[1] < weight.shape[0]:
            grad_w = (x.t() @ g).t().contiguous()                                 # (out, in)
        else:
            grad_w = g.t() @ x
        return grad_x, grad_w, g.sum(0)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose fp32 CPU backward is
    :class:`_LinearFn`; elsewhere (other devices, dtypes, autocast, no bias) ``F.linear``.

    ``split_backward`` (set by :func:`split_backward`): ``F.linear`` always. :class:`_LinearFn`
    is one autograd node that computes the input and the weight gradient together, so a backward
    asked for one of them (zero-bubble schedules' input pass, then their weight pass) computes
    both each time; torch's own node computes only the one asked for."""

    split_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (not self.split_backward and self.bias is not None and x.device.type == "cpu" and x.dtype == torch.float32
                and self.weight.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")):
            return _LinearFn.apply(x, self.weight, self.bias)
        return super().forward(x)


def split_backward(module: nn.Module, on: bool = True) -> None:
    """Set :attr:`Linear.split_backward` on every :class:`Linear` of ``module``."""
    for m in module.modules():
        if isinstance(m, Linear):
            m.split_backward = on


@contextmanager
def splitting_backward(module: nn.Module) -> Iterator[None]:
    """:func:`split_backward` on ``module`` for the block, each :class:`Linear` as it was after."""
    linears = [m for m in module.modules() if isinstance(m, Linear)]
    before = [m.split_backward for m in linears]
    split_backward(module)
    try:
        yield
    finally:
        for m, was in zip(linears, before):
            m.split_backward = was


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
            layers.append(Linear(prev, size))
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
