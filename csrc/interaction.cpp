// DLRM's dot interaction, fused (the math and its register blocking per ISA:
// csrc/kernels/interaction.h): checks and the pooled layout here, then the active
// variant's kernel.
//
// Pooled layout: either a contiguous (B, F * D) tensor, or any flat buffer in which feature
// k of sample b starts at offsets[k] + b * strides[k] (e.g. the source-major output of the
// pooled AlltoAll, read in place: no assembling copy). Gradients go back in the same layout,
// multiplied by grad_scale (the sharded collection's 1 / W), into a buffer like `pooled`.
#include "interaction.h"

#include <vector>

#include "cpu_isa.h"

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
  return a;
}

}  // namespace

at::Tensor dot_interaction_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                  const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  at::Tensor out = at::empty({B, D + P}, dense.options());
  kernels().interaction_forward(args_of(dense, pooled, F, L), out.data_ptr<float>());
  return out;
}

std::tuple<at::Tensor, at::Tensor> dot_interaction_backward(
    const at::Tensor& grad_out, const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
    const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides, double grad_scale) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  TORCH_CHECK(grad_out.device().is_cpu() && grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.dim() == 2 && grad_out.size(0) == B && grad_out.size(1) == D + P,
              "neo._C: dot interaction: grad_out must be a contiguous (B, D + P) fp32 CPU tensor");
  at::Tensor gd = at::empty({B, D}, dense.options());
  at::Tensor gp = at::empty_like(pooled);   // every element is written (layout_of: the vectors tile it)
  kernels().interaction_backward(args_of(dense, pooled, F, L), grad_out.data_ptr<float>(), gd.data_ptr<float>(),
                                 gp.data_ptr<float>(), static_cast<float>(grad_scale));
  return {gd, gp};
}

}  // namespace neo
