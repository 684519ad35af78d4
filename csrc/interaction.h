// DLRM's fused dot interaction on the CPU (interaction.cpp; bound in bindings.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace neo {

// dense (B, D), pooled (B, F * D), fp32 contiguous -> [dense, pairwise dots] (B, D + F (F + 1) / 2).
at::Tensor dot_interaction_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F);

// grad_out (B, D + P) -> (grad_dense (B, D), grad_pooled (B, F * D)).
std::tuple<at::Tensor, at::Tensor> dot_interaction_backward(const at::Tensor& grad_out, const at::Tensor& dense,
                                                            const at::Tensor& pooled, int64_t F);

}  // namespace neo
