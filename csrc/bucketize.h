// Row-range bucketization of one feature's ids for row-split sharding (bucketize.cpp; bound in bindings.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace neo {

// values: the feature's ids (1-D int32 or int64); bag_offsets: (B + 1) int64 into values;
// bounds: (S + 1) int64 ascending row boundaries, shard s holding rows [bounds[s], bounds[s + 1]).
// Returns (lengths (S, B) int64: ids of bag b in shard s; ids (n) like values, grouped by shard,
// then by bag, in order of occurrence, each minus its shard's first row; sizes (S,) int64;
// positions (n,) int64 of each kept id in values, empty unless with_positions). Ids outside
// [bounds[0], bounds[S]) are dropped.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bucketize_rows(
    const at::Tensor& values, const at::Tensor& bag_offsets, const at::Tensor& bounds, bool with_positions);

}  // namespace neo
