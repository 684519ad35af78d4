// DLRM's fused dot interaction on the CPU (interaction.cpp; bound in bindings.cpp, and as
// torch.ops.neo.dot_interaction with its backward, registered in interaction.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace neo {

// dense (B, D) and the F pooled vectors per sample -> [dense, pairwise dots] (B, D + F (F + 1) / 2).
// pooled: (B, F * D) contiguous when offsets/strides are absent; otherwise a flat buffer where
// feature k of sample b starts at offsets[k] + b * strides[k].
at::Tensor dot_interaction_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                  const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides);

// grad_out (B, D + P) -> (grad_dense (B, D), grad_pooled like pooled, in its layout, times grad_scale).
// The B * F vectors must tile the pooled buffer.
std::tuple<at::Tensor, at::Tensor> dot_interaction_backward(
    const at::Tensor& grad_out, const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
    const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides, double grad_scale);

// What torch.ops.neo.dot_interaction runs (the op with its backward as one autograd node), called
// without the dispatcher, or nullopt where the fused kernel does not apply (a tensor off the CPU
// or not fp32, or CPU autocast on): neo.models.DotInteraction's path, whose Python then has no
// checks to make. The op through the dispatcher with the checks in Python took 30-40 us more a
// forward call (best of 190) and 70-85 us more in the median, with the caches cold as after the
// rest of a training step (B 64 and 2048, one thread, AMD EPYC Zen 5, 2026-12-03).
std::optional<at::Tensor> dot_interaction_eager(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                                const std::optional<at::Tensor>& offsets,
                                                const std::optional<at::Tensor>& strides, double grad_scale);

// Diagnostics (tools/bench_interaction.py --bounds): the two above's memory traffic alone
// (kernels/probe.h), on a contiguous (B, F * D) pooled; outputs of the same shapes, no meaning.
at::Tensor interaction_traffic_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F);
std::tuple<at::Tensor, at::Tensor> interaction_traffic_backward(const at::Tensor& grad_out, const at::Tensor& dense,
                                                                const at::Tensor& pooled, int64_t F);

}  // namespace neo
