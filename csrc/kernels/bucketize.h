// Row-range bucketization for the input distribution of row-split tables (row_wise,
// table_row_wise), one ISA variant: every id goes to the shard holding its row, re-based
// to the shard.
//
// Two passes over the ids, one thread (a feature's ids are a few tens of thousands):
// 1. the shard of every id (the number of boundaries at or below it, counted without
//    branches: a binary search mispredicts on random ids, 8 ns an id; -1 outside every
//    shard), counted per (shard, bag);
// 2. every kept id written at its shard's cursor: ids stay in bag order, and in order of
//    occurrence within a bag, as the plain-torch path (a mask per shard) leaves them.
#pragma once

#include "util.h"

NEO_KERNELS_BEGIN

constexpr int64_t kLinearShards = 16;  // shards up to which an id's shard is a branch-free count

template <typename T>
void bucketize(const BucketizeArgs<T>& a) {
  const int64_t B = a.B, S = a.S;
  const int64_t* off = a.off;
  const int64_t* bounds = a.bounds;
  const int64_t N = off[B] - off[0];
  std::vector<int32_t> shard(static_cast<size_t>(N));
  const int64_t lo = bounds[0], hi = bounds[S];
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = off[b] - off[0]; i < off[b + 1] - off[0]; ++i) {
      const int64_t id = static_cast<int64_t>(a.values[i]);
      int32_t s = -1;
      if (id >= lo && id < hi) {
        if (S <= kLinearShards) {      // branch-free: ids of a batch fall in random shards
          s = 0;
          for (int64_t k = 1; k < S; ++k) s += id >= bounds[k];
        } else {
          s = static_cast<int32_t>(std::upper_bound(bounds + 1, bounds + S + 1, id) - (bounds + 1));
        }
        ++a.lens[s * B + b];
      }
      shard[static_cast<size_t>(i)] = s;
    }
  }
  std::vector<int64_t> cursor(static_cast<size_t>(S));
  int64_t acc = 0;
  for (int64_t s = 0; s < S; ++s) {
    int64_t n = 0;
    for (int64_t b = 0; b < B; ++b) n += a.lens[s * B + b];
    a.sizes[s] = n;
    cursor[static_cast<size_t>(s)] = acc;
    acc += n;
  }
  for (int64_t i = 0; i < N; ++i) {
    const int32_t s = shard[static_cast<size_t>(i)];
    if (s < 0) continue;
    const int64_t at = cursor[static_cast<size_t>(s)]++;
    a.out[at] = static_cast<T>(static_cast<int64_t>(a.values[i]) - bounds[s]);
    if (a.pos) a.pos[at] = i;
  }
}

NEO_KERNELS_END
