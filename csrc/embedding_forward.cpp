// Pooled forward lookup of a group: checks, then the active ISA variant's kernel
// (csrc/kernels/forward.h: the bag sums in registers, prefetching rows ahead; bit-identical
// to the reference in every variant) into an output buffer reused across calls
// (reused_buffers.h); and the gradient of its per-id weights (weight_grad.h).
#include <cstring>

#include "cpu_isa.h"
#include "embedding_kernels.h"
#include "reused_buffers.h"

namespace neo {

std::tuple<at::Tensor, int64_t> embedding_forward(
    const at::Tensor& weights, const at::Tensor& indices, const at::Tensor& offsets,
    const std::optional<at::Tensor>& per_sample_weights,
    const at::Tensor& table_rows, const at::Tensor& table_dims, const at::Tensor& weight_offsets,
    const at::Tensor& row_offsets, const at::Tensor& feature_table, const at::Tensor& output_offsets,
    const at::Tensor& feature_mean, int64_t batch_size) {
  const GroupMeta m = make_meta(table_rows, table_dims, weight_offsets, row_offsets, feature_table,
                                output_offsets, feature_mean, batch_size);
  check_inputs(m, weights, indices, offsets, per_sample_weights);
  // reused from an earlier call once nothing holds it (reused_buffers.h): a fresh output of
  // megabytes a call was faulted in page by page, a third of the forward's time where glibc
  // gives freed memory back. Four slots: a rank's table groups, each called once a step, keep
  // one each.
  thread_local Slots slots(4);
  at::Tensor out = reused_or_empty(slots, {m.B, m.total_dim}, weights.options().dtype(at::kFloat));
  if (m.B == 0 || m.F == 0) return {out, 0};
  const Lookup L{indices.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(),
                 per_sample_weights.has_value() ? per_sample_weights->data_ptr<float>() : nullptr};
  float* o = out.data_ptr<float>();
  const KernelTable& k = kernels();
  switch (weights.scalar_type()) {
    case at::kFloat: return {out, k.forward_f32(m, weights.data_ptr<float>(), L, o)};
    case at::kHalf: return {out, k.forward_f16(m, weights.data_ptr<c10::Half>(), L, o)};
    case at::kBFloat16: return {out, k.forward_bf16(m, weights.data_ptr<c10::BFloat16>(), L, o)};
    default: TORCH_CHECK(false, "neo._C: weights must be fp32, fp16 or bf16, got ", weights.scalar_type());
  }
  return {out, 0};
}

at::Tensor embedding_weight_grad(
    const at::Tensor& weights, const at::Tensor& indices, const at::Tensor& offsets, const at::Tensor& grad_output,
    const at::Tensor& table_rows, const at::Tensor& table_dims, const at::Tensor& weight_offsets,
    const at::Tensor& row_offsets, const at::Tensor& feature_table, const at::Tensor& output_offsets,
    const at::Tensor& feature_mean, int64_t batch_size) {
  const GroupMeta m = make_meta(table_rows, table_dims, weight_offsets, row_offsets, feature_table,
                                output_offsets, feature_mean, batch_size);
  check_inputs(m, weights, indices, offsets, std::nullopt);
  TORCH_CHECK(grad_output.device().is_cpu() && grad_output.scalar_type() == at::kFloat && grad_output.is_contiguous() &&
                  grad_output.dim() == 2 && grad_output.size(0) == m.B && grad_output.size(1) == m.total_dim,
              "neo._C.embedding_weight_grad: grad_output must be a contiguous CPU fp32 tensor of shape (", m.B, ", ",
              m.total_dim, ")");
  at::Tensor out = at::zeros({indices.numel()}, weights.options().dtype(at::kFloat));
  if (m.B == 0 || m.F == 0) return out;
  const Lookup L{indices.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(), nullptr};
  const float* g = grad_output.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const KernelTable& k = kernels();
  switch (weights.scalar_type()) {
    case at::kFloat: k.weight_grad_f32(m, weights.data_ptr<float>(), L, g, o); break;
    case at::kHalf: k.weight_grad_f16(m, weights.data_ptr<c10::Half>(), L, g, o); break;
    case at::kBFloat16: k.weight_grad_bf16(m, weights.data_ptr<c10::BFloat16>(), L, g, o); break;
    default: TORCH_CHECK(false, "neo._C: weights must be fp32, fp16 or bf16, got ", weights.scalar_type());
  }
  return out;
}

int64_t gather_probe(const at::Tensor& table, int64_t row_bytes, const at::Tensor& ids, int64_t near, int64_t far,
                     int64_t far_hint, int64_t far_every) {
  TORCH_CHECK(table.device().is_cpu() && table.is_contiguous(), "neo._C.gather_probe: table must be a contiguous CPU tensor");
  TORCH_CHECK(row_bytes > 0 && row_bytes % 64 == 0, "neo._C.gather_probe: row_bytes must be a positive multiple of 64");
  TORCH_CHECK(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.is_contiguous() && ids.dim() == 1,
              "neo._C.gather_probe: ids must be a contiguous 1-D CPU int64 tensor");
  TORCH_CHECK(near >= 0 && far >= 0, "neo._C.gather_probe: near and far must be >= 0");
  TORCH_CHECK(far_hint >= 0 && far_hint <= 2, "neo._C.gather_probe: far_hint must be 0, 1 or 2, got ", far_hint);
  TORCH_CHECK(far_every >= 1, "neo._C.gather_probe: far_every must be >= 1, got ", far_every);
  const int64_t rows = table.numel() * table.element_size() / row_bytes;
  int64_t invalid = 0;   // counted in the gather's loop (no pass of its own); those rows are not read
  const uint64_t sum = kernels().gather_probe(static_cast<const uint8_t*>(table.data_ptr()), row_bytes, rows,
                                              ids.data_ptr<int64_t>(), ids.numel(), near, far, far_hint,
                                              far_every, &invalid);
  TORCH_CHECK(invalid == 0, "neo._C.gather_probe: ids must lie in [0, ", rows, "): ", invalid, " of ", ids.numel(),
              " do not");
  return static_cast<int64_t>(sum & 0x7fffffffffffffffULL);
}

int64_t chase_probe(const at::Tensor& table, int64_t row_bytes, int64_t start, int64_t steps) {
  TORCH_CHECK(table.device().is_cpu() && table.is_contiguous(),
              "neo._C.chase_probe: table must be a contiguous CPU tensor");
  TORCH_CHECK(row_bytes >= 8 && row_bytes % 8 == 0, "neo._C.chase_probe: row_bytes must be a positive multiple of 8");
  TORCH_CHECK(steps >= 0, "neo._C.chase_probe: steps must be >= 0, got ", steps);
  const uint64_t rows = static_cast<uint64_t>(table.numel() * table.element_size() / row_bytes);
  TORCH_CHECK(start >= 0 && static_cast<uint64_t>(start) < rows, "neo._C.chase_probe: start must lie in [0, ", rows,
              "), got ", start);
  const auto* base = static_cast<const uint8_t*>(table.data_ptr());
  uint64_t row = static_cast<uint64_t>(start);
  int64_t s = 0;
  for (; s < steps; ++s) {   // one dependent load a step: the next row's address is this row's value
    uint64_t next;
    std::memcpy(&next, base + row * static_cast<uint64_t>(row_bytes), sizeof(next));
    if (next >= rows) break;
    row = next;
  }
  TORCH_CHECK(s == steps, "neo._C.chase_probe: step ", s, " reads row ", row, ", whose next row lies outside [0, ",
              rows, ")");
  return static_cast<int64_t>(row);
}

}  // namespace neo
