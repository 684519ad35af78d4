// A batch's distinct rows on the CPU (bound in bindings.cpp): what a cached table's prefetch
// needs of its ids, torch.unique(sorted=True, return_inverse=True) over the valid ids, in one
// pass and a radix sort (the reference, and the GPU's path: neo/embedding/cache/prefetch.py,
// ModuleCache._rows).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace neo {

// ids: (n,) int64 CPU. Returns (rows (U,): the distinct ids in [0, num_rows), ascending;
// where (n,) int64: the position in rows of each id, -1 for an id outside [0, num_rows)).
// num_rows <= 2^32 and n < 2^32.
std::tuple<at::Tensor, at::Tensor> unique_rows(const at::Tensor& ids, int64_t num_rows);

}  // namespace neo
