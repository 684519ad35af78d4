// Position weights of a jagged batch's ids (position_weights.cpp; bound in bindings.cpp, used by
// neo.embedding.PositionWeights): each id's slot in the module's table (its feature's first slot
// plus its place in the bag) in one pass over the bags, and the table's read and its gradient.
// The table is the features' weights laid end to end, then one constant slot of weight 1 (the
// features without position weights). Plain loops: a pass over 16k ids takes microseconds.
#pragma once

#include <ATen/ATen.h>

#include <tuple>
#include <vector>

namespace neo {

// offsets: (F * B + 1,) int64 bag offsets of F features of B samples (from 0, nondecreasing, to
// n ids); first: (F,) int64, each feature's first slot, or -1 for a feature without weights (its
// ids get slot `ones`); limits: (F,) int64, each weighted feature's longest bag.
// Returns (slots (n,) int64, the first bag (feature * B + sample) longer than its feature's
// limit, or -1). Slots past a too-long bag's limit are `ones` (the caller raises).
std::tuple<at::Tensor, int64_t> position_slots(const at::Tensor& offsets, const at::Tensor& first,
                                               const at::Tensor& limits, int64_t ones, int64_t batch_size,
                                               int64_t n);

// (N,) fp32: the table's weights at slots (N,) int64, the table being parts (each 1-D fp32,
// contiguous) end to end then 1. Throws naming the first slot outside the table.
at::Tensor position_read(const std::vector<at::Tensor>& parts, const at::Tensor& slots);

// The parts' gradients (each (sizes[p],) fp32) of position_read: grad (N,) fp32 summed at slots
// (in double, then rounded once); the constant slot takes none.
std::vector<at::Tensor> position_read_backward(const at::Tensor& grad, const at::Tensor& slots,
                                               const std::vector<int64_t>& sizes);

}  // namespace neo
