// Range check of a batch's ids, one ISA variant: per feature, the ids outside [0, rows of its
// table), and optionally every id narrowed to the int32 wire (clamped to [-1, 2^31 - 1], so an
// invalid id stays invalid). One pass, one unsigned compare an id (a negative id reads as a huge
// unsigned one): the torch reference (neo/embedding/checks.py, ``count_bad_ids_reference``)
// takes six to eight passes (each id's limit by repeat_interleave, two compares, an or, a cumsum
// of the flags and their differences at the feature starts).
#pragma once

#include "util.h"

NEO_KERNELS_BEGIN

template <typename T>
void id_check(const IdCheckArgs<T>& a) {
  const int64_t F = a.F;
  const int64_t N = a.starts[F];
  if (N == 0) return;
  // Chunks of about 64k ids; each counts into its own row of `partial`, summed at the end
  // (the same totals for any chunking).
  const int64_t chunks = num_chunks(N, int64_t(1) << 16);
  std::vector<int64_t> partial(static_cast<size_t>(chunks * F), 0);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t s = N * c / chunks, e = N * (c + 1) / chunks;
      int64_t f = std::upper_bound(a.starts, a.starts + F + 1, s) - a.starts - 1;   // feature holding id s
      int64_t i = s;
      while (i < e) {
        const int64_t end = std::min(e, a.starts[f + 1]);
        const uint64_t rows = static_cast<uint64_t>(a.rows[f]);
        int64_t bad = 0;
        if (a.out32) {
          for (int64_t k = i; k < end; ++k) {
            const int64_t v = static_cast<int64_t>(a.values[k]);
            bad += static_cast<uint64_t>(v) >= rows;
            a.out32[k] = static_cast<int32_t>(v < 0 ? int64_t(-1) : std::min<int64_t>(v, INT32_MAX));
          }
        } else {
          for (int64_t k = i; k < end; ++k) bad += static_cast<uint64_t>(static_cast<int64_t>(a.values[k])) >= rows;
        }
        partial[static_cast<size_t>(c * F + f)] += bad;
        i = end;
        ++f;
      }
    }
  });
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t f = 0; f < F; ++f) a.counts[f] += partial[static_cast<size_t>(c * F + f)];
}

NEO_KERNELS_END
