// Entry points of the CPU embedding kernels (bound to Python in bindings.cpp): they check
// their tensors and call the active ISA variant's kernels (cpu_isa.h).
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include "common.h"

namespace neo {

// Pooled lookup: returns ((B, total_dim) fp32, number of ids outside [0, rows) skipped).
std::tuple<at::Tensor, int64_t> embedding_forward(
    const at::Tensor& weights, const at::Tensor& indices, const at::Tensor& offsets,
    const std::optional<at::Tensor>& per_sample_weights,
    const at::Tensor& table_rows, const at::Tensor& table_dims, const at::Tensor& weight_offsets,
    const at::Tensor& row_offsets, const at::Tensor& feature_table, const at::Tensor& output_offsets,
    const at::Tensor& feature_mean, int64_t batch_size);

// Fused backward + sparse optimizer step, in place on weights and states; returns the
// number of invalid ids skipped.
int64_t embedding_backward_update(
    const at::Tensor& weights, const std::vector<at::Tensor>& states, const at::Tensor& grad_output,
    const at::Tensor& indices, const at::Tensor& offsets, const std::optional<at::Tensor>& per_sample_weights,
    const at::Tensor& table_rows, const at::Tensor& table_dims, const at::Tensor& weight_offsets,
    const at::Tensor& row_offsets, const at::Tensor& feature_table, const at::Tensor& output_offsets,
    const at::Tensor& feature_mean, int64_t batch_size,
    int64_t opt_kind, double lr, double eps, double weight_decay, double beta1, double beta2,
    int64_t step, int64_t seed, bool stochastic_rounding);

// Tests: rows of x (n, D) fp32 rounded to fp16/bf16 as the optimizers store updated rows,
// row i at flat element indices elem0 + i D .. (stochastic rounding keyed by seed, step).
at::Tensor round_rows(const at::Tensor& x, const std::string& dtype, bool stochastic_rounding, int64_t seed,
                      int64_t step, int64_t elem0);

// Diagnostics (tools/bench_gather_probe.py): the plainest random-row gather, rows `ids` of
// `row_bytes` bytes of a flat buffer, prefetching `near` ids ahead into L1 and `far` ids
// ahead (0: off) with locality hint `far_hint` (1: L2, 2: prefetcht2, 0: non-temporal), every
// `far_every`-th line of a row, on the torch threads, with the active variant; returns a
// checksum. Raises where an id lies outside the table (counted in the gather's loop, its row
// not read).
int64_t gather_probe(const at::Tensor& table, int64_t row_bytes, const at::Tensor& ids, int64_t near, int64_t far,
                     int64_t far_hint, int64_t far_every);

// Diagnostics (tools/bench_gather_probe.py): the memory latency. Rows of `row_bytes` bytes of
// a flat buffer each hold, in their first 8 bytes, the index of the next row to read; `steps`
// dependent reads from row `start` (no prefetch can run ahead: each address is the previous
// read's value); returns the row reached. Raises where a row's next index lies outside the
// buffer, naming the step.
int64_t chase_probe(const at::Tensor& table, int64_t row_bytes, int64_t start, int64_t steps);

// Gradient of the pooled lookup with respect to its per-id weights: (N,) fp32 (see
// csrc/kernels/weight_grad.h), from grad_output (B, total_dim) fp32.
at::Tensor embedding_weight_grad(
    const at::Tensor& weights, const at::Tensor& indices, const at::Tensor& offsets, const at::Tensor& grad_output,
    const at::Tensor& table_rows, const at::Tensor& table_dims, const at::Tensor& weight_offsets,
    const at::Tensor& row_offsets, const at::Tensor& feature_table, const at::Tensor& output_offsets,
    const at::Tensor& feature_mean, int64_t batch_size);

inline void check_inputs(const GroupMeta& m, const at::Tensor& weights, const at::Tensor& indices,
                         const at::Tensor& offsets, const std::optional<at::Tensor>& psw) {
  TORCH_CHECK(weights.device().is_cpu() && weights.is_contiguous() && weights.dim() == 1,
              "neo._C: weights must be a contiguous 1-D CPU tensor");
  int64_t nw = 0;
  for (int64_t t = 0; t < m.T; ++t) nw = std::max(nw, m.woff[t] + m.rows[t] * m.dims[t]);
  TORCH_CHECK(weights.numel() >= nw, "neo._C: weights has ", weights.numel(), " elements, layout needs ", nw);
  TORCH_CHECK(indices.device().is_cpu() && indices.scalar_type() == at::kLong && indices.is_contiguous() &&
                  indices.dim() == 1, "neo._C: indices must be a contiguous 1-D CPU int64 tensor");
  TORCH_CHECK(offsets.device().is_cpu() && offsets.scalar_type() == at::kLong && offsets.is_contiguous() &&
                  offsets.numel() == m.F * m.B + 1,
              "neo._C: offsets must be a contiguous CPU int64 tensor of F * B + 1 = ", m.F * m.B + 1, " entries");
  const int64_t* off = offsets.data_ptr<int64_t>();
  TORCH_CHECK(off[0] == 0 && off[m.F * m.B] <= indices.numel(), "neo._C: offsets must start at 0 and end within indices");
  for (int64_t i = 0; i < m.F * m.B; ++i)  // cheap (one pass over F * B), keeps every loop in bounds
    TORCH_CHECK(off[i] <= off[i + 1], "neo._C: offsets decrease at bag ", i);
  if (psw.has_value()) {
    TORCH_CHECK(psw->device().is_cpu() && psw->scalar_type() == at::kFloat && psw->is_contiguous() &&
                    psw->numel() == indices.numel(),
                "neo._C: per_sample_weights must be a contiguous CPU fp32 tensor like indices");
  }
}

}  // namespace neo
