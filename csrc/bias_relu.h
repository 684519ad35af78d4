// An MLP layer's bias + ReLU around its GEMM, fused (bias_relu.cpp; the kernels per ISA:
// csrc/kernels/bias_relu.h; bound in bindings.cpp, used by neo.models.mlp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace neo {

// y (B, N) = relu(y + bias), in place; returns y.
at::Tensor bias_relu_(const at::Tensor& y, const at::Tensor& bias);

// (grad_pre (B, N) = grad where y > 0 else 0, grad_bias (N,) = its column sums).
std::tuple<at::Tensor, at::Tensor> relu_bias_backward(const at::Tensor& grad, const at::Tensor& y);

}  // namespace neo
