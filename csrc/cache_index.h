// The bookkeeping of a cached table's index on the CPU (bound in bindings.cpp): an admission,
// and the eviction choice inside it. The reference is neo/embedding/cache/index.py
// (CacheIndex.admit and _victims, kernel="reference"), tested equal to these slot for slot.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace neo {

// The `need` slots to evict: among the slots not pinned (pinned: slot ids, repeats allowed) and
// not never-used (key == INT64_MAX), those with the smallest (group << 56 | key, row), where
// row = row_of_slot[slot] and group, with a lookahead window (window_mask (N,) int64 of bits,
// bit_value (63,) int64: the group of each bit's batch, 0 for unused bits), is the largest
// bit_value over the set bits of window_mask[row], else 0. In the reference's order: the slots
// below the cut in increasing slot order, then those at the cut (by increasing row where some
// are left out). Also returns the number of evictable slots; where it is below `need`, no
// slots. key (C,) and row_of_slot (C,): contiguous CPU int64.
std::tuple<at::Tensor, int64_t> cache_victims(const at::Tensor& key, const at::Tensor& pinned, int64_t need,
                                              const at::Tensor& row_of_slot,
                                              const std::optional<at::Tensor>& window_mask,
                                              const std::optional<at::Tensor>& bit_value);

// Admission of batch `seq` (rows: sorted unique int64 ids in [0, N)), in place on the index's
// arrays: slot_of_row (N,) int32, row_of_slot (C,) int64, key (C,) int64, count (N,) int32 for
// lfu and lookahead (else none), free (F,) int64 (never-used slots, taken from the front);
// pinned: the slots of the other batches in flight; window_mask / bit_value as for
// cache_victims. Returns (slots (U,), miss_rows (M,), fill_slots (M,), evicted_rows (E,),
// evicted_slots (E,), hits, free slots taken, evictable): as the reference's Admission. Where
// the misses need more victims than there are evictable slots, only the counts have changed
// (as in the reference), the tensors are empty and `evictable` says why: the caller raises.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t> cache_admit(
    const at::Tensor& rows, int64_t seq, const at::Tensor& slot_of_row, const at::Tensor& row_of_slot,
    const at::Tensor& key, const std::optional<at::Tensor>& count, const at::Tensor& free, const at::Tensor& pinned,
    const std::optional<at::Tensor>& window_mask, const std::optional<at::Tensor>& bit_value);

// The lookahead window's moves, in place on its (N,) int64 mask: bit clear_bits[k] cleared on
// the rows clear_rows[k] (batches leaving the window), then bit set_bits[k] set on the rows
// set_rows[k] (batches entering it). Rows: int64 ids in [0, N); bits in [0, 63).
void cache_window_update(const at::Tensor& mask, const std::vector<at::Tensor>& clear_rows,
                         const std::vector<int64_t>& clear_bits, const std::vector<at::Tensor>& set_rows,
                         const std::vector<int64_t>& set_bits);

}  // namespace neo
