// Gather of jagged rows from blocks laid end to end (jagged_take.cpp; bound in bindings.cpp on
// numpy arrays): the data loader's per-batch take of a multi-hot column from a shuffle window's
// row groups, whose ids are read-only views of Arrow buffers.
#pragma once

#include <cstdint>
#include <vector>

namespace neo {

// One block: its ids (n_ids elements of elem_size bytes) and (n_rows + 1) offsets into them.
struct JaggedBlock {
  const char* ids;
  int64_t n_ids;
  const int64_t* offsets;
  int64_t n_rows;
};

// Output offsets (m + 1, from 0) of rows (part[i], row[i]); throws std::invalid_argument
// naming the first bad row (block or row out of range, its offsets outside the block's ids or
// decreasing).
void jagged_take_offsets(const std::vector<JaggedBlock>& blocks, const int64_t* part, const int64_t* row,
                         int64_t m, int64_t* out_offsets);

// Copies the rows into out (out_offsets[m] elements), in parallel over rows (at::parallel_for).
void jagged_take_copy(const std::vector<JaggedBlock>& blocks, const int64_t* part, const int64_t* row, int64_t m,
                      const int64_t* out_offsets, int64_t elem_size, char* out);

}  // namespace neo
