// Row gathers across blocks (see jagged_take.h). Memory copies only: no ISA variants.
#include "jagged_take.h"

#include <ATen/Parallel.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace neo {
namespace {

// Output row i asks for row r of block p: a block of `blocks` (any block type with n_rows), a row of it.
template <class Block>
void check_row(const char* op, const std::vector<Block>& blocks, int64_t i, int64_t p, int64_t r) {
  const int64_t P = static_cast<int64_t>(blocks.size());
  if (p < 0 || p >= P || r < 0 || r >= blocks[p].n_rows)
    throw std::invalid_argument(std::string(op) + ": output row " + std::to_string(i) + " asks for row " +
                                std::to_string(r) + " of block " + std::to_string(p) + " (" + std::to_string(P) +
                                " blocks)");
}

}  // namespace

void jagged_take_offsets(const std::vector<JaggedBlock>& blocks, const int64_t* part, const int64_t* row,
                         int64_t m, int64_t* out_offsets) {
  const int64_t P = static_cast<int64_t>(blocks.size());
  for (int64_t p = 0; p < P; ++p) {
    const JaggedBlock& b = blocks[p];
    if (b.n_rows < 0 || b.offsets[0] < 0 || b.offsets[b.n_rows] > b.n_ids)
      throw std::invalid_argument("jagged_take: block " + std::to_string(p) + ": offsets outside its " +
                                  std::to_string(b.n_ids) + " ids");
  }
  out_offsets[0] = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t p = part[i], r = row[i];
    check_row("jagged_take", blocks, i, p, r);
    const JaggedBlock& b = blocks[p];
    const int64_t lo = b.offsets[r], hi = b.offsets[r + 1];
    if (lo < 0 || hi < lo || hi > b.n_ids)        // offsets may decrease and rise again: each row checked
      throw std::invalid_argument("jagged_take: block " + std::to_string(p) + ": row " + std::to_string(r) +
                                  " spans ids [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of " +
                                  std::to_string(b.n_ids));
    const int64_t len = hi - lo;
    out_offsets[i + 1] = out_offsets[i] + len;
  }
}

void jagged_take_copy(const std::vector<JaggedBlock>& blocks, const int64_t* part, const int64_t* row, int64_t m,
                      const int64_t* out_offsets, int64_t elem_size, char* out) {
  at::parallel_for(0, m, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const JaggedBlock& b = blocks[part[i]];
      std::memcpy(out + out_offsets[i] * elem_size, b.ids + b.offsets[row[i]] * elem_size,
                  static_cast<size_t>((out_offsets[i + 1] - out_offsets[i]) * elem_size));
    }
  });
}

void fixed_take(const std::vector<FixedBlock>& blocks, const int64_t* part, const int64_t* row, int64_t m,
                int64_t row_bytes, char* out) {
  for (int64_t i = 0; i < m; ++i) check_row("fixed_take", blocks, i, part[i], row[i]);
  at::parallel_for(0, m, 1024, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(out + i * row_bytes, blocks[part[i]].rows + row[i] * row_bytes, static_cast<size_t>(row_bytes));
  });
}

}  // namespace neo
