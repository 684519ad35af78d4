// Tensor-side helpers of the embedding entry points (compiled for the baseline ISA): the
// group metadata read from the layout's tensors. The kernels themselves are in kernels/.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

#include "kernel_types.h"

namespace neo {

inline const int64_t* int64_ptr(const at::Tensor& t, const char* name, int64_t numel) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous(),
              "neo._C: ", name, " must be a contiguous CPU int64 tensor");
  TORCH_CHECK(t.numel() == numel, "neo._C: ", name, " has ", t.numel(), " entries, expected ", numel);
  return t.data_ptr<int64_t>();
}

inline GroupMeta make_meta(const at::Tensor& table_rows, const at::Tensor& table_dims,
                           const at::Tensor& weight_offsets, const at::Tensor& row_offsets,
                           const at::Tensor& feature_table, const at::Tensor& output_offsets,
                           const at::Tensor& feature_mean, int64_t batch_size) {
  GroupMeta m;
  m.T = table_rows.numel();
  m.F = feature_table.numel();
  m.B = batch_size;
  m.rows = int64_ptr(table_rows, "table_rows", m.T);
  m.dims = int64_ptr(table_dims, "table_dims", m.T);
  m.woff = int64_ptr(weight_offsets, "weight_offsets", m.T);
  m.roff = int64_ptr(row_offsets, "row_offsets", m.T);
  m.ftable = int64_ptr(feature_table, "feature_table", m.F);
  m.outoff = int64_ptr(output_offsets, "output_offsets", m.F + 1);
  m.fmean = int64_ptr(feature_mean, "feature_mean", m.F);
  // Every size and offset is checked here, so that no kernel reads or writes outside its tensors
  // whatever a caller passes (the Python layer builds these from a validated layout).
  TORCH_CHECK(batch_size >= 0, "neo._C: batch_size must be >= 0, got ", batch_size);
  TORCH_CHECK(m.outoff[0] == 0, "neo._C: output_offsets must start at 0, got ", m.outoff[0]);
  m.total_dim = m.outoff[m.F];
  for (int64_t t = 0; t < m.T; ++t) {
    TORCH_CHECK(m.rows[t] >= 0 && m.dims[t] >= 0 && m.woff[t] >= 0 && m.roff[t] >= 0, "neo._C: table ", t,
                ": table_rows, table_dims, weight_offsets and row_offsets must be >= 0, got ", m.rows[t], ", ",
                m.dims[t], ", ", m.woff[t], ", ", m.roff[t]);
    m.total_rows += m.rows[t];
    m.max_dim = std::max(m.max_dim, m.dims[t]);
  }
  for (int64_t t = 0; t < m.T; ++t)   // a table's rows in the group's row space (rowwise state, update keys)
    TORCH_CHECK(m.roff[t] + m.rows[t] <= m.total_rows, "neo._C: table ", t, ": row_offsets ", m.roff[t], " + ",
                m.rows[t], " rows exceeds the group's ", m.total_rows, " rows");
  for (int64_t f = 0; f < m.F; ++f) {
    TORCH_CHECK(m.ftable[f] >= 0 && m.ftable[f] < m.T, "neo._C: feature_table out of range");
    TORCH_CHECK(m.outoff[f + 1] - m.outoff[f] == m.dims[m.ftable[f]], "neo._C: output_offsets disagree with table_dims");
    TORCH_CHECK(m.fmean[f] == 0 || m.fmean[f] == 1, "neo._C: feature_mean must be 0 or 1, got ", m.fmean[f],
                " for feature ", f);
  }
  return m;
}

}  // namespace neo
