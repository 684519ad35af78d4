// DLRM's dot interaction, fused (the math and its register blocking per ISA:
// csrc/kernels/interaction.h): checks and the pooled layout here, then the active
// variant's kernel; output buffers reused across calls (reused_or_empty, reused_buffers.h);
// and the op with its backward as one C++ autograd node, torch.ops.neo.dot_interaction, which
// neo.models.DotInteraction calls without the dispatcher (dot_interaction_eager).
//
// Pooled layout: either a contiguous (B, F * D) tensor, or any flat buffer in which feature
// k of sample b starts at offsets[k] + b * strides[k] (e.g. the source-major output of the
// pooled AlltoAll, read in place: no assembling copy). Gradients go back in the same layout,
// multiplied by grad_scale (the sharded collection's 1 / W), into a buffer like `pooled`.
#include "interaction.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <vector>

#include "cpu_isa.h"
#include "reused_buffers.h"

namespace neo {
namespace {

// Where feature k of sample b starts in the pooled buffer: off[k] + b * stride[k].
struct Layout {
  std::vector<int64_t> off, stride;
};

// Validates the inputs and returns the pooled layout.
Layout layout_of(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                 const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  TORCH_CHECK(dense.device().is_cpu() && dense.scalar_type() == at::kFloat && dense.is_contiguous() && dense.dim() == 2,
              "neo._C: dot interaction: dense must be a contiguous (B, D) fp32 CPU tensor");
  TORCH_CHECK(F >= 1 && F + 1 <= 256, "neo._C: dot interaction supports 1 to 255 features, got ", F);
  TORCH_CHECK(pooled.device().is_cpu() && pooled.scalar_type() == at::kFloat && pooled.is_contiguous(),
              "neo._C: dot interaction: pooled must be a contiguous fp32 CPU tensor");
  const int64_t B = dense.size(0), D = dense.size(1);
  Layout L;
  L.off.resize(F);
  L.stride.resize(F);
  if (!offsets.has_value()) {
    TORCH_CHECK(!strides.has_value(), "neo._C: dot interaction: feature strides given without offsets");
    TORCH_CHECK(pooled.dim() == 2 && pooled.size(0) == B && pooled.size(1) == F * D,
                "neo._C: dot interaction: pooled must be (B, F * D) = (", B, ", ", F * D, "), got ", pooled.sizes());
    for (int64_t k = 0; k < F; ++k) { L.off[k] = k * D; L.stride[k] = F * D; }
    return L;
  }
  TORCH_CHECK(strides.has_value(), "neo._C: dot interaction: feature offsets given without strides");
  TORCH_CHECK(pooled.numel() == B * F * D, "neo._C: dot interaction: the ", B, " x ", F, " vectors of ", D,
              " floats must tile the pooled buffer, which has ", pooled.numel(), " elements");
  for (const at::Tensor* t : {&*offsets, &*strides})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == F,
                "neo._C: dot interaction: feature offsets and strides must be (F,) = (", F, ",) int64 CPU tensors");
  const int64_t* o = offsets->data_ptr<int64_t>();
  const int64_t* st = strides->data_ptr<int64_t>();
  for (int64_t k = 0; k < F; ++k) {
    TORCH_CHECK(o[k] >= 0 && st[k] >= 0 && o[k] + (B > 0 ? (B - 1) * st[k] : 0) + D <= pooled.numel(),
                "neo._C: dot interaction: feature ", k, " (offset ", o[k], ", stride ", st[k],
                ") reaches past the pooled buffer of ", pooled.numel(), " elements");
    L.off[k] = o[k];
    L.stride[k] = st[k];
  }
  return L;
}

InteractionArgs args_of(const at::Tensor& dense, const at::Tensor& pooled, int64_t F, const Layout& L) {
  InteractionArgs a;
  a.B = dense.size(0);
  a.D = dense.size(1);
  a.F = F;
  a.dense = dense.data_ptr<float>();
  a.pooled = pooled.data_ptr<float>();
  a.off = L.off.data();
  a.stride = L.stride.data();
  a.tiles = interaction_tiles_at(a.D);
  a.l1_next = interaction_l1_next();
  return a;
}

using ForwardKernel = void (*)(const InteractionArgs&, float* out);
using BackwardKernel = void (*)(const InteractionArgs&, const float* grad_out, float* grad_dense, float* grad_pooled,
                                float scale);

at::Tensor run_forward(ForwardKernel kernel, const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                       const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  thread_local Slots slots(2);
  at::Tensor out = reused_or_empty(slots, {B, D + P}, dense.options());
  kernel(args_of(dense, pooled, F, L), out.data_ptr<float>());
  return out;
}

std::tuple<at::Tensor, at::Tensor> run_backward(BackwardKernel kernel, const at::Tensor& grad_out,
                                                const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                                const std::optional<at::Tensor>& offsets,
                                                const std::optional<at::Tensor>& strides, double grad_scale) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  TORCH_CHECK(grad_out.device().is_cpu() && grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.dim() == 2 && grad_out.size(0) == B && grad_out.size(1) == D + P,
              "neo._C: dot interaction: grad_out must be a contiguous (B, D + P) fp32 CPU tensor");
  thread_local Slots dense_slots(2), pooled_slots(2);
  at::Tensor gd = reused_or_empty(dense_slots, {B, D}, dense.options());
  at::Tensor gp = reused_or_empty(pooled_slots, pooled.sizes(), pooled.options());   // like pooled (contiguous);
                                                                                    // every element is written
                                                                                    // (layout_of: the vectors tile it)
  kernel(args_of(dense, pooled, F, L), grad_out.data_ptr<float>(), gd.data_ptr<float>(), gp.data_ptr<float>(),
         static_cast<float>(grad_scale));
  return {gd, gp};
}

// The flat index in the pooled buffer of each float of the B x F pooled vectors: (B * F * D,),
// sample-major (the order of a (B, F * D) tensor).
at::Tensor pooled_index(const Layout& L, int64_t B, int64_t D) {
  const int64_t F = static_cast<int64_t>(L.off.size());
  const at::Tensor off = at::tensor(L.off, at::kLong).view({1, F, 1});
  const at::Tensor stride = at::tensor(L.stride, at::kLong).view({1, F, 1});
  const at::Tensor b = at::arange(B, at::kLong).view({B, 1, 1}), d = at::arange(D, at::kLong).view({1, 1, D});
  return (b * stride + off + d).reshape(-1);
}

// The backward's formula in differentiable ATen ops (the torch path's, neo/models/interaction.py),
// on the same pooled layout and grad_scale as the kernel: v = [dense, pooled vectors] (B, n, D),
// S the pair gradients symmetrised (B, n, n), grad v = S v. For a backward that is itself
// differentiated; about the torch path's speed.
std::tuple<at::Tensor, at::Tensor> backward_as_ops(const at::Tensor& grad_out, const at::Tensor& dense,
                                                   const at::Tensor& pooled, int64_t F,
                                                   const std::optional<at::Tensor>& offsets,
                                                   const std::optional<at::Tensor>& strides, double grad_scale) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  TORCH_CHECK(grad_out.dim() == 2 && grad_out.size(0) == B && grad_out.size(1) == D + P,
              "neo._C: dot interaction: grad_out must be (B, D + P) = (", B, ", ", D + P, "), got ", grad_out.sizes());
  const at::Tensor idx = pooled_index(L, B, D);
  const at::Tensor v = at::cat({dense.unsqueeze(1), pooled.reshape(-1).index_select(0, idx).view({B, F, D})}, 1);
  std::vector<int64_t> pairs;                                          // (i, j), i < j, as i * n + j
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) pairs.push_back(i * n + j);
  const at::Tensor S = at::zeros({B, n * n}, grad_out.options())
                           .index_copy(1, at::tensor(pairs, at::kLong), grad_out.narrow(1, D, P))
                           .view({B, n, n});
  const at::Tensor dv = at::bmm(S + S.transpose(1, 2), v);           // (B, n, D)
  const at::Tensor gd = grad_out.narrow(1, 0, D) + dv.select(1, 0);
  const at::Tensor gp = at::zeros({pooled.numel()}, pooled.options())
                            .index_copy(0, idx, dv.narrow(1, 1, F).reshape(-1) * grad_scale)
                            .view(pooled.sizes());
  return {gd, gp};
}

}  // namespace

at::Tensor dot_interaction_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                  const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  return run_forward(kernels().interaction_forward, dense, pooled, F, offsets, strides);
}

std::tuple<at::Tensor, at::Tensor> dot_interaction_backward(
    const at::Tensor& grad_out, const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
    const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides, double grad_scale) {
  return run_backward(kernels().interaction_backward, grad_out, dense, pooled, F, offsets, strides, grad_scale);
}

at::Tensor interaction_traffic_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F) {
  return run_forward(kernels().interaction_traffic_forward, dense, pooled, F, std::nullopt, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> interaction_traffic_backward(const at::Tensor& grad_out, const at::Tensor& dense,
                                                                const at::Tensor& pooled, int64_t F) {
  return run_backward(kernels().interaction_traffic_backward, grad_out, dense, pooled, F, std::nullopt,
                      std::nullopt, 1.0);
}

namespace {

// Forward and backward as one autograd node in C++: no Python autograd.Function around the
// kernels. At B 2048 each step runs with cold caches (the batch streams through), and the
// Python path's own code and objects cost about 0.15 ms a direction then (the kernels:
// 1.5 + 2 ms at D 64). The name says "Fused": tests find it in grad_fn.
class FusedDotInteraction : public torch::autograd::Function<FusedDotInteraction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& dense, const at::Tensor& pooled,
                            int64_t F, const std::optional<at::Tensor>& offsets,
                            const std::optional<at::Tensor>& strides, double grad_scale) {
    ctx->save_for_backward({dense, pooled});   // contiguous (fused_apply): the inputs themselves
    ctx->saved_data["F"] = F;
    ctx->saved_data["offsets"] = offsets;
    ctx->saved_data["strides"] = strides;
    ctx->saved_data["grad_scale"] = grad_scale;
    return dot_interaction_forward(dense, pooled, F, offsets, strides);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const int64_t F = ctx->saved_data["F"].toInt();
    const auto offsets = ctx->saved_data["offsets"].toOptional<at::Tensor>();
    const auto strides = ctx->saved_data["strides"].toOptional<at::Tensor>();
    const double grad_scale = ctx->saved_data["grad_scale"].toDouble();
    // create_graph=True (a gradient penalty, Hessian-vector products): gradients that carry a
    // graph. The kernel's carry none, and autograd would take them as constants: second-order
    // terms through the interaction silently dropped, or "does not require grad" raised.
    auto [gd, gp] = at::GradMode::is_enabled()
                        ? backward_as_ops(grads[0], saved[0], saved[1], F, offsets, strides, grad_scale)
                        : dot_interaction_backward(grads[0].contiguous(), saved[0], saved[1], F, offsets, strides,
                                                   grad_scale);
    return {gd, gp, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The node on contiguous inputs: a non-contiguous one is copied by a differentiable op
// first, so that the tensors saved for backward are the node's inputs, whose graph a
// differentiated backward (backward_as_ops) needs.
at::Tensor fused_apply(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                       const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides,
                       double grad_scale) {
  return FusedDotInteraction::apply(dense.contiguous(), pooled.contiguous(), F, offsets, strides, grad_scale);
}

at::Tensor dot_interaction(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                           const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides,
                           double grad_scale) {
  return fused_apply(dense, pooled, F, offsets, strides, grad_scale);
}

}  // namespace

std::optional<at::Tensor> dot_interaction_eager(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                                const std::optional<at::Tensor>& offsets,
                                                const std::optional<at::Tensor>& strides, double grad_scale) {
  if (!dense.device().is_cpu() || !pooled.device().is_cpu() || dense.scalar_type() != at::kFloat ||
      pooled.scalar_type() != at::kFloat || at::autocast::is_autocast_enabled(at::kCPU))
    return std::nullopt;
  return fused_apply(dense, pooled, F, offsets, strides, grad_scale);
}

}  // namespace neo

// torch.ops.neo.dot_interaction (after `import neo._C`): the fused op with its backward, the
// pooled layout and grad_scale as in dot_interaction_forward / _backward.
TORCH_LIBRARY_FRAGMENT(neo, m) {
  m.def("dot_interaction(Tensor dense, Tensor pooled, int num_features, Tensor? feature_offsets=None, "
        "Tensor? feature_strides=None, float grad_scale=1.0) -> Tensor");
}
TORCH_LIBRARY_IMPL(neo, CompositeImplicitAutograd, m) { m.impl("dot_interaction", &neo::dot_interaction); }
