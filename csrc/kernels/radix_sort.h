// Parallel, stable LSD radix sort of packed 64-bit items (key << 32 | position) by key.
//
// Each pass: every chunk (a contiguous range of items, one per thread) counts its digits
// (in one chunk, one read of the items counts the digits of every pass), a serial prefix
// sum over (digit, chunk) gives every chunk its write cursors, every chunk scatters its
// items in order. Chunk order = item order, so the sort is stable and the result does not
// depend on the number of threads (positions stay in increasing order within a key:
// summation order = order of occurrence, deterministic).
//
// sort_table_segments: the fused backward's items come feature by feature, so where the
// features' tables ascend, the items are already grouped by table and each table's segment
// needs sorting only by its local row (key - first row of the table): fewer key bits than
// the whole group's, and a segment of a small table sorts in cache. The multi-hot
// bench_train's two ranks (15 tables of 100k rows, 340k items; 11 tables with one of 100
// ids a bag, 537k items), caches flushed before each sort, Intel Xeon, AVX2: 0.65-0.70x and
// 0.84-0.94x the time of the whole sort; in the benchmark itself (NEO_PROFILE) 7.0 -> 3.7-5.1
// and 8.3-12.7 -> 6.7-8.8 ms.
//
// The scatter writes to one cursor per bucket (up to 4096), in a buffer the rest of the step
// has pushed out of the caches: every cache line it starts is a miss that the hardware
// prefetchers, following so many streams, do not foresee. So a cursor entering a new line
// prefetches, with write intent, the line after the next one. A sort of 409,600 items
// of 17-bit keys (2 passes of 512 buckets), caches flushed before each sort, Intel Xeon,
// AVX2: 10.5-11.0 -> 5.7-5.8 ms; at 655k items over 1M rows 13.1 -> 7.8 ms; a segment
// in cache (28k items) unchanged (scratch program, 2026-12-02). Not on AMD Zen 5 (family 1Ah:
// tuning().sort_prefetch 0 there, default_tuning), where the same prefetches made the sort
// slower: 655k items of 23-bit keys (2 passes of 4096 buckets) in the fused backward, one
// thread, with and without them alternating (NEO_PROFILE, 2026-12-05), 3.05-3.10 against
// 1.73-1.75 ms; forward + backward 4-5% faster without them with 20 ids a bag, 2-3% with one id
// or fp16 rows, 2% at two threads. neo._C._set_tuning(sort_prefetch=...) sets it, for benchmarks.
#pragma once

#include "util.h"

NEO_KERNELS_BEGIN

// One chunk's items src[s, e) to their buckets' cursors h[digit] in dst (one pass). Arguments,
// not captured references: a store through an int64 pointer could alias those, and the
// compiler would reload them every item (the sort took 1.8x as long).
template <bool PREFETCH>
inline void scatter(int64_t* __restrict h, const uint64_t* __restrict src, uint64_t* __restrict dst, int64_t s,
                    int64_t e, uint64_t base, uint64_t mask, int shift) {
  for (int64_t i = s; i < e; ++i) {
    const uint64_t v = src[i];
    const int64_t pos = h[(((v >> 32) - base) >> shift) & mask]++;
    dst[pos] = v;
    // a bucket's cursor entering a new cache line: its line after next, with write intent
    if (PREFETCH && (pos & 7) == 0) __builtin_prefetch(dst + pos + 16, 1, 3);
  }
}

// Sorts items[0, n) by key - base, where base <= key < base + 2^key_bits (key = bits 32..63),
// in at most `max_chunks` chunks (0: one a thread, each at least 32k items). Returns the
// buffer (a or b) holding the result.
inline uint64_t* radix_sort_by_key(uint64_t* a, uint64_t* b, int64_t n, int key_bits, uint64_t base = 0,
                                   int64_t max_chunks = 0) {
  if (key_bits <= 0 || n <= 1) return a;
  const int passes = (key_bits + 11) / 12;                 // <= 4096 buckets a pass
  const int digit_bits = (key_bits + passes - 1) / passes;
  const int64_t buckets = int64_t(1) << digit_bits;
  const uint64_t mask = static_cast<uint64_t>(buckets - 1);
  // One chunk a thread (each at least 32k items): the result is the same for any chunking
  // (a stable sort), and every chunk more costs a histogram of `buckets` counts, read with a
  // stride in the prefix sum (20 chunks of 4096 counts at 655k items: 3.8 ms a sort on one
  // thread, against 2.4 ms for one chunk).
  const int64_t chunks = std::min<int64_t>(num_chunks(n, 1 << 15),
                                           max_chunks > 0 ? max_chunks : std::max(1, at::get_num_threads()));
  const int64_t per_pass = chunks * buckets;
  std::vector<int64_t> hist(passes * per_pass, 0);          // [pass][chunk][digit]
  // Counts of passes [p0, p1) of every chunk of `a`. One chunk: every pass's digits in one read
  // (the totals do not depend on the order); more: each pass counts its own input (a chunk's
  // items change between passes).
  auto count = [&](int p0, int p1) {
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t s = n * c / chunks, e = n * (c + 1) / chunks;
        // locals, not the captured references (see scatter)
        const uint64_t* const src = a;
        const uint64_t bs = base, mk = mask;
        for (int p = p0; p < p1;) {   // two passes' digits a read where there are two
          int64_t* __restrict const h0 = hist.data() + p * per_pass + c * buckets;
          const int sh0 = p * digit_bits;
          if (p + 1 < p1) {
            int64_t* __restrict const h1 = h0 + per_pass;
            const int sh1 = sh0 + digit_bits;
            for (int64_t i = s; i < e; ++i) {
              const uint64_t k = (src[i] >> 32) - bs;
              ++h0[(k >> sh0) & mk];
              ++h1[(k >> sh1) & mk];
            }
            p += 2;
          } else {
            for (int64_t i = s; i < e; ++i) ++h0[(((src[i] >> 32) - bs) >> sh0) & mk];
            p += 1;
          }
        }
      }
    });
  };
  if (chunks == 1) count(0, passes);
  for (int p = 0; p < passes; ++p) {
    if (chunks > 1) count(p, p + 1);
    int64_t* hp = hist.data() + p * per_pass;
    int64_t run = 0;
    for (int64_t d = 0; d < buckets; ++d)
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t v = hp[c * buckets + d];
        hp[c * buckets + d] = run;
        run += v;
      }
    const bool prefetch = tuning().sort_prefetch != 0;
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        if (prefetch) scatter<true>(hp + c * buckets, a, b, n * c / chunks, n * (c + 1) / chunks, base, mask,
                                    p * digit_bits);
        else scatter<false>(hp + c * buckets, a, b, n * c / chunks, n * (c + 1) / chunks, base, mask, p * digit_bits);
      }
    });
    std::swap(a, b);
  }
  return a;
}

// Items [start, end) whose keys are all in [base, base + rows): one table's.
struct KeySegment {
  int64_t start, end;
  uint64_t base, rows;
};

// Sorts items[0, n) by key when `segs` cut them, in order, into segments of ascending,
// disjoint key ranges (so only each segment needs sorting). Same result as
// radix_sort_by_key over the whole range; returns a (the result is always there).
inline uint64_t* sort_table_segments(uint64_t* a, uint64_t* b, const std::vector<KeySegment>& segs) {
  auto bits = [](uint64_t rows) { return rows > 1 ? 64 - __builtin_clzll(rows - 1) : 0; };
  auto one = [&](const KeySegment& s, int64_t max_chunks) {
    const int64_t n = s.end - s.start;
    const uint64_t* r = radix_sort_by_key(a + s.start, b + s.start, n, bits(s.rows), s.base, max_chunks);
    if (r != a + s.start) std::memcpy(a + s.start, r, n * sizeof(uint64_t));
  };
  // Segments of at least 256k items sort one at a time on every thread; the others, one a thread.
  constexpr int64_t kBig = int64_t(1) << 18;
  std::vector<int64_t> small;
  for (int64_t i = 0; i < static_cast<int64_t>(segs.size()); ++i) {
    if (segs[i].end - segs[i].start >= kBig) one(segs[i], 0);
    else small.push_back(i);
  }
  at::parallel_for(0, static_cast<int64_t>(small.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) one(segs[small[i]], 1);
  });
  return a;
}

NEO_KERNELS_END
