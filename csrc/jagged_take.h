// Gathers of rows from blocks laid end to end (jagged_take.cpp; bound in bindings.cpp on numpy
// arrays): the data loader's per-batch take of a column from a shuffle window's row groups, whose
// arrays are read-only views of Arrow buffers. Jagged (multi-hot lists) and fixed-width (labels,
// dense features, one-hot and fixed multi-hot ids) columns.
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

// One block of a fixed-width column: n_rows rows of the same byte width, contiguous.
struct FixedBlock {
  const char* rows;
  int64_t n_rows;
};

// out row i = row row[i] of block part[i] (row_bytes each), in parallel over rows; throws
// std::invalid_argument naming the first output row that asks for a row outside the blocks
// (checked before anything is copied).
void fixed_take(const std::vector<FixedBlock>& blocks, const int64_t* part, const int64_t* row, int64_t m,
                int64_t row_bytes, char* out);

}  // namespace neo
