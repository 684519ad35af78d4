// Helpers shared by the kernels of one variant: dtype conversions of whole rows, work
// partitioning, per-thread scratch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <ATen/Parallel.h>

#include "simd.h"

NEO_KERNELS_BEGIN

// Storage dtype -> fp32, exact. fp32 rows are used in place (row_f32), others converted.
inline void load_f32(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}
template <typename T>  // c10::Half or c10::BFloat16: whole vectors, then a scalar tail
inline void load_f32(const T* src, float* dst, int64_t n) {
  const int64_t nv = n / kW * kW;
  for (int64_t i = 0; i < nv; i += kW) vstore(dst + i, vload(src + i));
  for (int64_t i = nv; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
inline const float* row_f32(const float* src, float*, int64_t) { return src; }
template <typename T>
inline const float* row_f32(const T* src, float* buf, int64_t n) {
  load_f32(src, buf, n);
  return buf;
}

// Split bags [0, nbags) into `chunks` contiguous ranges holding about equally many ids
// (bag lengths vary a lot: equal bag counts would leave one thread with the long bags).
inline std::vector<int64_t> split_bags_by_ids(const int64_t* offsets, int64_t nbags, int64_t chunks) {
  std::vector<int64_t> starts(chunks + 1);
  const int64_t n0 = offsets[0], n = offsets[nbags] - n0;
  starts[0] = 0;
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t target = n0 + n * c / chunks;
    const int64_t b = std::lower_bound(offsets, offsets + nbags, target) - offsets;   // first bag starting at or after
    starts[c] = std::max(starts[c - 1], std::min(b, nbags));
  }
  starts[chunks] = nbags;
  return starts;
}

// Threads worth using for `work` items at `min_per_chunk` each (at most torch's thread count).
inline int64_t num_chunks(int64_t work, int64_t min_per_chunk) {
  const int64_t t = at::get_num_threads();
  const int64_t by_work = std::max<int64_t>(1, work / std::max<int64_t>(1, min_per_chunk));
  return std::max<int64_t>(1, std::min(t, by_work));
}

// Per-thread scratch kept between calls (no allocation per call once warm).
template <typename T>
struct Buffer {
  std::unique_ptr<T[]> p;
  int64_t cap = 0;
  T* get(int64_t n) {
    if (n > cap) { p.reset(new T[std::max<int64_t>(n, 1)]); cap = n; }
    return p.get();
  }
};

NEO_KERNELS_END
