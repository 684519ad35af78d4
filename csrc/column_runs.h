// Column runs between row-aligned matrices, in one pass (column_runs.cpp; bound in bindings.cpp,
// used by neo.distributed.assemble): the sharded collection's and the one-host output
// distribution's assembly of received pieces into table order, and the way back.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace neo {

// For every row b and every run r = runs[r] = (src, src_col, dst, dst_col, n, add), in run order:
//   dst[r.dst][b, r.dst_col : r.dst_col + n]  = scale * src[r.src][b, r.src_col : ...]   (add 0)
//   dst[r.dst][b, r.dst_col : r.dst_col + n] += src[r.src][b, r.src_col : ...]           (add 1)
// srcs and dsts: 2-D fp32 CPU matrices of the same row count, unit column stride (any row
// stride); runs: (R, 6) int64, contiguous. An add run adds to what an earlier run of the same
// row wrote (fp32, in run order: ((a + b) + c)). scale applies to copies only (1: an exact copy).
// Runs out of their matrices' columns, or a bad matrix, are std::invalid_argument naming them
// (checked before anything is written). Rows in parallel (at::parallel_for).
void column_runs(const std::vector<at::Tensor>& srcs, const std::vector<at::Tensor>& dsts, const at::Tensor& runs,
                 double scale);

}  // namespace neo
