"""The fused dot interaction and an MLP's linear + ReLU as torch.library custom ops, for ``torch.compile``
and ``torch.export``.

In eager mode :class:`~neo.models.interaction.DotInteraction` calls ``neo._C`` directly (a pybind
function making a C++ autograd node: no dispatcher on the way, tens of microseconds a call). A
tracer cannot go through that: Dynamo breaks its graph at every pybind call, and the fake tensors
of ``torch.export`` (and of AOTAutograd) have no data for a C++ kernel to read, so an export of a
DLRM failed. While a tracer runs, the module calls the ops defined here instead: each is one
opaque node of the graph, with a fake kernel (the output's shape, for tracing) and a registered
backward, itself a custom op. The compiled or exported graph runs the same C++ kernels as eager
mode and gives the same numbers.

    neo::dot_interaction_fused(dense (B, D), pooled (B, F * D), F) -> (B, D + F (F + 1) / 2)
    neo::dot_interaction_fused_backward(grad (B, D + P), dense, pooled, F) -> (grad_dense, grad_pooled)
    neo::linear_relu(x (B, in), weight (out, in), bias (out,)) -> (B, out)      an MLP's hidden layer
    neo::relu_bias_backward(grad (B, out), out) -> (masked grad, grad_bias)

A double backward through them is not defined (``create_graph=True`` under ``torch.compile``);
eager mode has one (csrc/interaction.cpp).
"""

from __future__ import annotations

from typing import Tuple

import torch

from neo.cpp import cpu_kernels


def _kernels():
    _C = cpu_kernels("dot_interaction_forward")
    if _C is None:
        raise RuntimeError("neo::dot_interaction_fused needs neo._C, which is not built (pip install -e .)")
    return _C


def _check_shapes(dense: torch.Tensor, pooled: torch.Tensor, num_features: int) -> Tuple[int, int]:
    if dense.dim() != 2 or pooled.dim() != 2:
        raise ValueError(f"dot interaction: dense and pooled must be 2-D, got {tuple(dense.shape)} and "
                         f"{tuple(pooled.shape)}")
    B, D = dense.shape
    if tuple(pooled.shape) != (B, num_features * D):
        raise ValueError(f"dot interaction: pooled must be (B, F * D) = ({B}, {num_features * D}) for dense "
                         f"{tuple(dense.shape)} and F = {num_features}, got {tuple(pooled.shape)}")
    return B, D


@torch.library.custom_op("neo::dot_interaction_fused", mutates_args=())
def dot_interaction_fused(dense: torch.Tensor, pooled: torch.Tensor, num_features: int) -> torch.Tensor:
    """``[dense, pairwise dots of (dense, pooled_1..F)]``: fp32 CPU tensors (csrc/interaction.cpp)."""
    _check_shapes(dense, pooled, num_features)
    return _kernels().dot_interaction_forward(dense.contiguous(), pooled.contiguous(), num_features)


@dot_interaction_fused.register_fake
def _(dense: torch.Tensor, pooled: torch.Tensor, num_features: int) -> torch.Tensor:
    B, D = _check_shapes(dense, pooled, num_features)
    return dense.new_empty(B, D + (num_features + 1) * num_features // 2)


@torch.library.custom_op("neo::dot_interaction_fused_backward", mutates_args=())
def dot_interaction_fused_backward(grad: torch.Tensor, dense: torch.Tensor, pooled: torch.Tensor,
                                   num_features: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`dot_interaction_fused` in ``dense`` (B, D) and ``pooled`` (B, F * D)."""
    return _kernels().dot_interaction_backward(grad.contiguous(), dense.contiguous(), pooled.contiguous(),
                                               num_features)


@dot_interaction_fused_backward.register_fake
def _(grad: torch.Tensor, dense: torch.Tensor, pooled: torch.Tensor,
      num_features: int) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_shapes(dense, pooled, num_features)
    return torch.empty_like(dense, memory_format=torch.contiguous_format), \
        torch.empty_like(pooled, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output) -> None:
    dense, pooled, num_features = inputs
    ctx.save_for_backward(dense, pooled)
    ctx.num_features = num_features


def _backward(ctx, grad: torch.Tensor):
    dense, pooled = ctx.saved_tensors
    grad_dense, grad_pooled = dot_interaction_fused_backward(grad, dense, pooled, ctx.num_features)
    return grad_dense, grad_pooled, None


dot_interaction_fused.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("neo::linear_relu", mutates_args=())
def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``relu(x W^T + b)`` (B, out) as eager mode's ``_LinearReLUFn``: ``mm``, then bias and ReLU in
    one pass in place (csrc/kernels/bias_relu.h): the same numbers, and one pass where the traced
    ``mm``, ``+`` and ``relu`` would make three over the activation."""
    y = torch.mm(x, weight.t())                                                  # (B, out)
    _C = cpu_kernels("bias_relu_")
    return torch.relu_(y.add_(bias)) if _C is None else _C.bias_relu_(y, bias)


@linear_relu.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("neo::relu_bias_backward", mutates_args=())
def relu_bias_backward(grad: torch.Tensor, out: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gradient masked where ``out`` (the ReLU's output) is 0, and its column sums (the bias's)."""
    _C = cpu_kernels("bias_relu_")
    if _C is None:
        masked = torch.ops.aten.threshold_backward(grad, out, 0.0)
        return masked, masked.sum(0)
    return _C.relu_bias_backward(grad.contiguous(), out)


@relu_bias_backward.register_fake
def _(grad: torch.Tensor, out: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(out, memory_format=torch.contiguous_format), out.new_empty(out.shape[1])


def _linear_relu_context(ctx, inputs, output) -> None:
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output)


def _linear_relu_backward(ctx, grad: torch.Tensor):
    x, weight, out = ctx.saved_tensors
    masked, grad_bias = relu_bias_backward(grad, out)                             # (B, out), (out,)
    return masked @ weight, masked.t() @ x, grad_bias


linear_relu.register_autograd(_linear_relu_backward, setup_context=_linear_relu_context)


def fused_applies(dense: torch.Tensor, pooled: torch.Tensor) -> bool:
    """Whether the fused op takes these inputs: fp32 CPU tensors outside CPU autocast."""
    return (dense.device.type == "cpu" and pooled.device.type == "cpu" and dense.dtype == torch.float32
            and pooled.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"))
