// The machine's random-row gather speed (tools/bench_gather_probe.py): the plainest
// possible gather, against which the forward lookup's lookups/s are reported.
//
// Rows ids[0..n) of row_bytes bytes each are read and summed as 32-bit integers into one
// vector register per thread (integer adds: garbage float bits could hit slow denormal
// paths), the ids split into one contiguous range per torch thread. Rows `near` ids ahead
// are prefetched into L1 and rows `far` ids ahead into L2 (0 turns either off); the
// benchmark takes the best of several distances. No bags, no output, no validity checks.
#pragma once

#include "util.h"

NEO_KERNELS_BEGIN

// Rows ids[s, e) of BYTES bytes (0: row_bytes, known only at run time) summed into acc.
template <int64_t BYTES>
inline vi probe_range(const uint8_t* table, int64_t row_bytes, const int64_t* ids, int64_t s, int64_t e,
                      int64_t near, int64_t far, vi acc) {
  const int64_t rb = BYTES ? BYTES : row_bytes;
  for (int64_t i = s; i < e; ++i) {
    if (near && i + near < e) {
      const uint8_t* p = table + ids[i + near] * rb;
      for (int64_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o, 0, 3);
    }
    if (far && i + far < e) {
      const uint8_t* p = table + ids[i + far] * rb;
      for (int64_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o, 0, 1);
    }
    const uint8_t* r = table + ids[i] * rb;
    for (int64_t o = 0; o < rb; o += static_cast<int64_t>(sizeof(vi))) acc = viadd(acc, viload(r + o));
  }
  return acc;
}

uint64_t gather_probe(const uint8_t* table, int64_t row_bytes, const int64_t* ids, int64_t n, int64_t near,
                      int64_t far) {
  const int64_t chunks = num_chunks(n, 4096);
  std::vector<uint64_t> sums(chunks, 0);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t s = n * c / chunks, e = n * (c + 1) / chunks;
      vi acc = vizero();
      switch (row_bytes) {   // the common row sizes unrolled, as the forward's are
        case 128: acc = probe_range<128>(table, row_bytes, ids, s, e, near, far, acc); break;
        case 256: acc = probe_range<256>(table, row_bytes, ids, s, e, near, far, acc); break;
        case 512: acc = probe_range<512>(table, row_bytes, ids, s, e, near, far, acc); break;
        case 1024: acc = probe_range<1024>(table, row_bytes, ids, s, e, near, far, acc); break;
        default: acc = probe_range<0>(table, row_bytes, ids, s, e, near, far, acc); break;
      }
      uint32_t lanes[sizeof(vi) / 4];
      std::memcpy(lanes, &acc, sizeof(acc));
      for (uint32_t x : lanes) sums[c] += x;
    }
  });
  uint64_t total = 0;
  for (uint64_t x : sums) total += x;
  return total;
}

NEO_KERNELS_END
