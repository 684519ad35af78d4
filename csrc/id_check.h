// Range check of a batch's ids (id_check.cpp; the kernel per ISA: csrc/kernels/id_check.h;
// bound in bindings.cpp, used by neo.embedding.checks).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace neo {

// values: (N,) int32 or int64 ids, feature after feature; starts: (F + 1,) int64, each feature's
// first id then N (starts[0] = 0); rows: (F,) int64, the rows of the table each feature reads.
// Returns (counts (F,) int64: ids outside [0, rows[f]); the ids as int32 clamped to
// [-1, 2^31 - 1] if to_int32, else an empty tensor).
std::tuple<at::Tensor, at::Tensor> check_id_ranges(const at::Tensor& values, const at::Tensor& starts,
                                                   const at::Tensor& rows, bool to_int32);

}  // namespace neo
