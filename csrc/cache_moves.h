// The row copies of a cached table's admission on the CPU (bound in bindings.cpp): the dirty
// victims written back to the backing store, then the missing rows read into their slots, in one
// pass over the rows. The reference is neo/embedding/cache/table_cache.py (TableCache._write_back
// and _fill with torch indexing, moves="reference"), tested equal to this bit for bit.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace neo {

// One admission's moves, in place: for each k with dirty[evicted_slots[k]], the slot's row of
// every buffer is copied to row evicted_rows[k] of the store's (the write-back); then row
// fill_rows[k] of the store's buffers to slot fill_slots[k] of the cache's, and the slot marked
// clean; then, where given, the slots `mark` marked dirty (a training batch). Buffers in pairs:
// slot_bufs[i] (C, ...) and store_bufs[i] (N, ...) of one dtype and row shape, on the CPU, each
// row contiguous (rows may be strided: the slots are views of a group's buffer). dirty: (C,)
// bool. Index tensors: int64 on the CPU. Every index is checked before the first copy. Returns
// the number of rows written back.
int64_t cache_swap_rows(const std::vector<at::Tensor>& slot_bufs, const std::vector<at::Tensor>& store_bufs,
                        const at::Tensor& dirty, const at::Tensor& evicted_slots, const at::Tensor& evicted_rows,
                        const at::Tensor& fill_slots, const at::Tensor& fill_rows,
                        const std::optional<at::Tensor>& mark);

}  // namespace neo
