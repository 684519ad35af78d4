// Parallel, stable LSD radix sort of packed 64-bit items (key << 32 | position) by key.
//
// Each pass: every chunk (a contiguous range of items, one per thread) counts its digits,
// a serial prefix sum over (digit, chunk) gives every chunk its write cursors, every chunk
// scatters its items in order. Chunk order = item order, so the sort is stable and the
// result does not depend on the number of threads (positions stay in increasing order
// within a key: summation order = order of occurrence, deterministic).
#pragma once

#include "util.h"

NEO_KERNELS_BEGIN

// Sorts items[0, n) by bits [32, 32 + key_bits); returns the buffer (a or b) holding the result.
inline uint64_t* radix_sort_by_key(uint64_t* a, uint64_t* b, int64_t n, int key_bits) {
  if (key_bits <= 0 || n <= 1) return a;
  const int passes = (key_bits + 11) / 12;                 // <= 4096 buckets a pass
  const int digit_bits = (key_bits + passes - 1) / passes;
  const int64_t buckets = int64_t(1) << digit_bits;
  // One chunk a thread (each at least 32k items): the result is the same for any chunking
  // (a stable sort), and every chunk more costs a histogram of `buckets` counts, read with a
  // stride in the prefix sum (20 chunks of 4096 counts at 655k items: 3.8 ms a sort on one
  // thread, against 2.4 ms for one chunk).
  const int64_t chunks = std::min<int64_t>(num_chunks(n, 1 << 15), std::max(1, at::get_num_threads()));
  std::vector<int64_t> hist(chunks * buckets);
  for (int p = 0; p < passes; ++p) {
    const int shift = 32 + p * digit_bits;
    const uint64_t mask = static_cast<uint64_t>(buckets - 1);
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        int64_t* h = hist.data() + c * buckets;
        std::fill(h, h + buckets, 0);
        const int64_t s = n * c / chunks, e = n * (c + 1) / chunks;
        for (int64_t i = s; i < e; ++i) ++h[(a[i] >> shift) & mask];
      }
    });
    int64_t run = 0;
    for (int64_t d = 0; d < buckets; ++d)
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t v = hist[c * buckets + d];
        hist[c * buckets + d] = run;
        run += v;
      }
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        int64_t* h = hist.data() + c * buckets;
        const int64_t s = n * c / chunks, e = n * (c + 1) / chunks;
        for (int64_t i = s; i < e; ++i) {
          const uint64_t v = a[i];
          b[h[(v >> shift) & mask]++] = v;
        }
      }
    });
    std::swap(a, b);
  }
  return a;
}

NEO_KERNELS_END
