// Fused backward + sparse optimizer step of a group: checks, the optimizer's constants,
// then the active ISA variant's kernel (csrc/kernels/backward.h: keys, a stable radix sort
// by row, then per row its summed gradient and the optimizer in place; no dense gradient).
#include <cmath>
#include <limits>

#include "cpu_isa.h"
#include "embedding_kernels.h"

namespace neo {
namespace {

OptParams make_opt_params(int64_t kind, double lr, double eps, double wd, double b1, double b2, int64_t step) {
  OptParams o;
  o.kind = kind;
  o.lr = static_cast<float>(lr);
  o.eps = static_cast<float>(eps);
  o.wd = static_cast<float>(wd);
  o.has_wd = wd != 0.0;
  o.b1 = static_cast<float>(b1);
  o.b2 = static_cast<float>(b2);
  o.one_minus_b1 = static_cast<float>(1.0 - b1);
  o.one_minus_b2 = static_cast<float>(1.0 - b2);
  o.bias1 = static_cast<float>(1.0 - std::pow(b1, static_cast<double>(step)));
  o.bias2 = static_cast<float>(1.0 - std::pow(b2, static_cast<double>(step)));
  return o;
}

// The counter-based stochastic-rounding key of (seed, step) (kernels/stochastic_rounding.h).
uint64_t sr_key(int64_t seed, int64_t step) {
  return static_cast<uint64_t>(seed) ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ULL);
}

}  // namespace

int64_t embedding_backward_update(
    const at::Tensor& weights, const std::vector<at::Tensor>& states, const at::Tensor& grad_output,
    const at::Tensor& indices, const at::Tensor& offsets, const std::optional<at::Tensor>& per_sample_weights,
    const at::Tensor& table_rows, const at::Tensor& table_dims, const at::Tensor& weight_offsets,
    const at::Tensor& row_offsets, const at::Tensor& feature_table, const at::Tensor& output_offsets,
    const at::Tensor& feature_mean, int64_t batch_size,
    int64_t opt_kind, double lr, double eps, double weight_decay, double beta1, double beta2,
    int64_t step, int64_t seed, bool stochastic_rounding) {
  const GroupMeta m = make_meta(table_rows, table_dims, weight_offsets, row_offsets, feature_table,
                                output_offsets, feature_mean, batch_size);
  check_inputs(m, weights, indices, offsets, per_sample_weights);
  TORCH_CHECK(opt_kind >= kSGD && opt_kind <= kLamb, "neo._C: unknown optimizer kind ", opt_kind);
  const bool rowwise = opt_kind == kRowwiseAdagrad;
  const size_t n_states = opt_kind == kSGD ? 0 : (opt_kind == kAdam || opt_kind == kLamb) ? 2 : 1;
  TORCH_CHECK(states.size() == n_states, "neo._C: optimizer expects ", n_states, " state tensors, got ", states.size());
  for (const auto& s : states) {
    TORCH_CHECK(s.device().is_cpu() && s.scalar_type() == at::kFloat && s.is_contiguous(),
                "neo._C: optimizer state must be contiguous CPU fp32");
    TORCH_CHECK(s.numel() >= (rowwise ? m.total_rows : weights.numel()), "neo._C: optimizer state too small");
  }
  TORCH_CHECK(grad_output.device().is_cpu() && grad_output.scalar_type() == at::kFloat && grad_output.is_contiguous() &&
                  grad_output.dim() == 2 && grad_output.size(0) == m.B && grad_output.size(1) == m.total_dim,
              "neo._C: grad_output must be a contiguous (B, total_dim) fp32 CPU tensor");
  if (m.B == 0 || m.F == 0) return 0;
  const int64_t N = offsets.data_ptr<int64_t>()[m.F * m.B];
  TORCH_CHECK(N < (int64_t(1) << 32) && m.F * m.B < (int64_t(1) << 32) && m.total_rows < (int64_t(1) << 31),
              "neo._C: a batch of ", N, " ids over ", m.total_rows, " rows exceeds the CPU kernel's 32-bit keys; "
              "split the group's tables or the batch");
  UpdateArgs u;
  u.s0 = n_states > 0 ? states[0].data_ptr<float>() : nullptr;
  u.s1 = n_states > 1 ? states[1].data_ptr<float>() : nullptr;
  u.rowwise_state = rowwise;
  u.grad = grad_output.data_ptr<float>();
  u.opt = make_opt_params(opt_kind, lr, eps, weight_decay, beta1, beta2, step);
  u.sr_key = sr_key(seed, step);
  const Lookup L{indices.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(),
                 per_sample_weights.has_value() ? per_sample_weights->data_ptr<float>() : nullptr};
  const KernelTable& k = kernels();
  switch (weights.scalar_type()) {
    case at::kFloat:
      return k.backward_f32(m, weights.data_ptr<float>(), L, u);
    case at::kHalf:
      u.stochastic = stochastic_rounding;
      return k.backward_f16(m, weights.data_ptr<c10::Half>(), L, u);
    case at::kBFloat16:
      u.stochastic = stochastic_rounding;
      return k.backward_bf16(m, weights.data_ptr<c10::BFloat16>(), L, u);
    default:
      TORCH_CHECK(false, "neo._C: weights must be fp32, fp16 or bf16, got ", weights.scalar_type());
  }
  return 0;
}

at::Tensor round_rows(const at::Tensor& x, const std::string& dtype, bool stochastic_rounding, int64_t seed,
                      int64_t step, int64_t elem0) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "neo._C._round_rows: x must be a contiguous 2-D CPU float32 tensor");
  const int64_t n = x.size(0), D = x.size(1);
  TORCH_CHECK(elem0 >= 0 && elem0 <= std::numeric_limits<int64_t>::max() - n * D,
              "neo._C._round_rows: the element indices elem0 .. elem0 + n D must lie in [0, 2^63), got elem0 = ", elem0);
  const uint64_t key = sr_key(seed, step);
  const KernelTable& k = kernels();
  if (dtype == "fp16") {
    at::Tensor out = at::empty({n, D}, x.options().dtype(at::kHalf));
    k.round_rows_f16(x.data_ptr<float>(), out.data_ptr<c10::Half>(), n, D, stochastic_rounding, key, elem0);
    return out;
  }
  TORCH_CHECK(dtype == "bf16", "neo._C._round_rows: dtype must be 'fp16' or 'bf16', got '", dtype, "'");
  at::Tensor out = at::empty({n, D}, x.options().dtype(at::kBFloat16));
  k.round_rows_bf16(x.data_ptr<float>(), out.data_ptr<c10::BFloat16>(), n, D, stochastic_rounding, key, elem0);
  return out;
}

}  // namespace neo
