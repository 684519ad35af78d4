"""Multi-layer perceptron: the bottom and top towers of DLRM."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from neo.cpp import cpu_kernels
from neo.models import traced_ops
from neo.models.autograd_modes import plain_autograd


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
        return grad_x, _weight_grad(g, x, weight), g.sum(0)


def _weight_grad(g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``g^T x`` (out, in), as ``(x^T g)^T`` for a widening layer (:class:`_LinearFn`)."""
    if weight.shape[1] < weight.shape[0]:
        return (x.t() @ g).t().contiguous()
    return g.t() @ x


class _LinearReLUFn(torch.autograd.Function):
    """``relu(x W^T + b)``: the product from ``mm``, then bias and ReLU in one pass over it in
    place (``neo._C.bias_relu_``); the backward masks the gradient and sums the bias gradient
    in one pass (``neo._C.relu_bias_backward``), then the two products as :class:`_LinearFn`.
    torch's addmm + relu and their backward make two more passes over the (B, out) activation
    each way (the bias copied into the output before the GEMM, a new tensor for the ReLU, a
    separate column sum): csrc/kernels/bias_relu.h."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        _C = cpu_kernels("bias_relu_")
        y = _C.bias_relu_(torch.mm(x, weight.t()), bias)                          # (B, out)
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, weight, y = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True (gradient penalties, Hessian-vector products): the masked gradient
            # from torch's op for relu's backward, which carries its graph back to g; the kernel's
            # carries none, and the second-order terms through this layer would be dropped.
            gp = torch.ops.aten.threshold_backward(g, y, 0.0)                    # (B, out)
            grad_b = gp.sum(0)
        else:
            gp, grad_b = cpu_kernels("bias_relu_").relu_bias_backward(g.contiguous(), y)   # (B, out), (out,)
        grad_x = gp @ weight if ctx.needs_input_grad[0] else None                 # (B, in)
        return grad_x, _weight_grad(gp, x, weight), grad_b


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose fp32 CPU backward is
    :class:`_LinearFn`; elsewhere (other devices, dtypes, autocast, no bias) ``F.linear``.
    :meth:`forward_relu`: the layer and a ReLU after it as one step (:class:`_LinearReLUFn`).

    ``split_backward`` (set by :func:`split_backward`): ``F.linear`` always. :class:`_LinearFn`
    is one autograd node that computes the input and the weight gradient together, so a backward
    asked for one of them (zero-bubble schedules' input pass, then their weight pass) computes
    both each time; torch's own node computes only the one asked for."""

    split_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fast(x):
            return _LinearFn.apply(x, self.weight, self.bias)
        return super().forward(x)

    def _fast(self, x: torch.Tensor) -> bool:
        """Whether the fp32 CPU autograd functions of this module apply to ``x``: not under
        torch.func's transforms (grad, vmap, jacrev, ...) or forward-mode AD, for which they
        define no rules, where ``F.linear`` serves; not while ``torch.compile`` or ``torch.export``
        traces (Dynamo breaks its graph at a pybind kernel; Inductor fuses bias and ReLU itself)."""
        return not torch.compiler.is_compiling() and self._fp32_cpu(x)

    def _fp32_cpu(self, x: torch.Tensor) -> bool:
        return (not self.split_backward and self.bias is not None and x.device.type == "cpu"
                and x.dtype == torch.float32 and self.weight.dtype == torch.float32
                and not torch.is_autocast_enabled("cpu") and plain_autograd())

    def forward_relu(self, x: torch.Tensor) -> torch.Tensor:
        """``relu(self(x))``, with bias and ReLU fused (:class:`_LinearReLUFn`) where the fp32 CPU
        path applies and ``neo._C`` has the kernels; while a tracer runs, the same kernels as the op
        ``neo::linear_relu`` (:mod:`neo.models.traced_ops`): compiled and exported programs give eager
        mode's numbers (``addmm`` would add the bias inside the GEMM and round otherwise)."""
        if self._fp32_cpu(x):
            if torch.compiler.is_compiling():
                return traced_ops.linear_relu(x, self.weight, self.bias)         # (B, out)
            if cpu_kernels("bias_relu_") is not None:
                return _LinearReLUFn.apply(x, self.weight, self.bias)
        return torch.relu(self(x))


def linear_activation(linear: nn.Module, activation: Optional[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """``activation(linear(x))`` (no activation: ``linear(x)``); a :class:`Linear` followed by
    an ``nn.ReLU`` as one step (:meth:`Linear.forward_relu`). The MLP's forward and the pipeline's
    layers (neo.pipeline.layers) run their layers through this, so both compute alike."""
    if activation is None:
        return linear(x)
    if isinstance(linear, Linear) and type(activation) is nn.ReLU:
        return linear.forward_relu(x)
    return activation(linear(x))


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

    ``MLP(13, [512, 256, 64])`` maps ``(B, 13)`` to ``(B, 64)``. The forward runs each
    :class:`Linear` followed by an ``nn.ReLU`` as one step (:func:`linear_activation`); the
    modules, parameters and state dict are those of the plain sequence.
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

    def layer_pairs(self) -> List[Tuple[nn.Module, Optional[nn.Module]]]:
        """(Linear, the activation after it or None) for every layer, in order."""
        pairs: List[Tuple[nn.Module, Optional[nn.Module]]] = []
        for m in self:
            if isinstance(m, nn.Linear):
                pairs.append((m, None))
            else:
                pairs[-1] = (pairs[-1][0], m)
        return pairs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear, activation in self.layer_pairs():
            x = linear_activation(linear, activation, x)
        return x

    def reset_parameters(self) -> None:
        """DLRM's initialisation: weights N(0, sqrt(2 / (fan_in + fan_out))), biases N(0, sqrt(1 / fan_out))."""
        for m in self:
            if isinstance(m, nn.Linear):
                fan_out, fan_in = m.weight.shape
                nn.init.normal_(m.weight, 0.0, (2.0 / (fan_in + fan_out)) ** 0.5)
                nn.init.normal_(m.bias, 0.0, (1.0 / fan_out) ** 0.5)
