// Gradient of a group's pooled lookup with respect to its per-id weights (one ISA variant).
//
// Id i of bag b of feature f enters the output as w_i * row_i (divided by the bag length under
// mean pooling), so out[i] = <row_i, g_b>, with g_b the bag's gradient row (its feature's
// columns, divided by the bag length first under mean pooling, as the reference does); 0 for an
// id outside [0, rows). The rows are read as they are at the call (the module calls this
// before the update). Work is split and rows are prefetched as in the forward (forward.h); a
// bag's gradient row stays in L1 while its ids are read.
//
// Products are rounded one by one (-ffp-contract=off) and summed in kW lanes, then across the
// lanes (kW ids at a time, one reduction tree), and the columns past the last whole vector
// last: another order than the reference's torch reduction, so the two agree to rounding.
#pragma once

#include "forward.h"

NEO_KERNELS_BEGIN

// out[q] = the sum of the lanes of acc[q], q < kW: one transposing reduction tree for kW ids
// (a lane sum per id would be a serial chain of kW adds).
inline void sum_lanes(const vf* acc, float* out) {
#if defined(__AVX512F__)
  _mm512_storeu_ps(out, hsum16(acc));
#elif defined(__AVX2__)
  hsum8(acc, out);
#else
  for (int q = 0; q < kW; ++q) out[q] = (acc[q][0] + acc[q][1]) + (acc[q][2] + acc[q][3]);
#endif
}

// The ids of the kW-id blocks being reduced: kW lane products, and the columns past the
// last whole vector of each.
struct DotBlock {
  vf acc[kW];
  float tail[kW], sums[kW];
  int64_t first = 0;   // the block's first id
  int n = 0;           // ids in the block
  void flush(float* out) {
    for (int q = n; q < kW; ++q) acc[q] = vzero();
    sum_lanes(acc, sums);
    for (int q = 0; q < n; ++q) out[first + q] = sums[q] + tail[q];
    first += n;
    n = 0;
  }
};

// The ids [s, e) of one bag against its gradient row g: NV whole vectors a row where NV > 0
// (the row length known at compile time: the loop unrolled, the prefetches' lengths constant),
// any D where NV == 0.
template <typename T, int NV>
__attribute__((always_inline)) inline void bag_dots(const T* table, uint64_t rows, int64_t D, const int64_t* idx,
                                                    int64_t s, int64_t e, int64_t fend, int64_t near, int64_t far,
                                                    const float* g, DotBlock& blk, float* out) {
  constexpr int64_t kBytes = NV * kW * static_cast<int64_t>(sizeof(T));
  const int64_t DV = NV ? NV * kW : D - D % kW, row_bytes = D * static_cast<int64_t>(sizeof(T));
  vf gv[NV ? NV : 1];
  if constexpr (NV > 0)
    for (int v = 0; v < NV; ++v) gv[v] = vload(g + v * kW);
  for (int64_t i = s; i < e; ++i) {
    if (__builtin_expect(i + near < fend, 1)) prefetch_id<kBytes, 3>(table, D, rows, idx[i + near], row_bytes);
    if (__builtin_expect(i + far < fend, 1)) prefetch_id<kBytes, 1>(table, D, rows, idx[i + far], row_bytes);
    const int64_t id = idx[i];
    vf a = vzero();
    float rest = 0.0f;
    if (__builtin_expect(static_cast<uint64_t>(id) < rows, 1)) {   // an id out of range: 0
      const T* row = table + id * D;
      if constexpr (NV > 0) {
        for (int v = 0; v < NV; ++v) a = vadd(a, vmul(vload(row + v * kW), gv[v]));
      } else {
        for (int64_t d = 0; d < DV; d += kW) a = vadd(a, vmul(vload(row + d), vload(g + d)));
        for (int64_t d = DV; d < D; ++d) rest += static_cast<float>(row[d]) * g[d];
      }
    }
    blk.acc[blk.n] = a;
    blk.tail[blk.n] = rest;
    if (++blk.n == kW) blk.flush(out);
  }
}

// Row length -> bag_dots with NV = D / kW at compile time (up to kPoolMaxNV), else the generic loop.
template <typename T, int NV = 1>
void bag_dots_dispatch(const T* table, uint64_t rows, int64_t D, const int64_t* idx, int64_t s, int64_t e,
                       int64_t fend, int64_t near, int64_t far, const float* g, DotBlock& blk, float* out) {
  if constexpr (NV > kPoolMaxNV) {
    bag_dots<T, 0>(table, rows, D, idx, s, e, fend, near, far, g, blk, out);
  } else {
    if (D == NV * kW) bag_dots<T, NV>(table, rows, D, idx, s, e, fend, near, far, g, blk, out);
    else bag_dots_dispatch<T, NV + 1>(table, rows, D, idx, s, e, fend, near, far, g, blk, out);
  }
}

template <typename T>
void weight_grad(const GroupMeta& m, const T* W, const Lookup& L, const float* grad, float* out) {
  const int64_t B = m.B, nbags = m.F * B;
  const int64_t* off = L.off;
  const int64_t chunks = num_chunks(off[nbags] - off[0] + nbags, 2048);
  const std::vector<int64_t> starts = split_bags_by_ids(off, nbags, chunks);
  const int64_t near = std::max<int64_t>(1, tuning().fwd_prefetch), far = 8 * near;
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> scaled(m.max_dim);   // a mean-pooled bag's gradient over its length
    DotBlock blk;
    for (int64_t c = c0; c < c1; ++c) {
      blk.first = off[starts[c]];
      for (int64_t fb = starts[c]; fb < starts[c + 1]; ++fb) {
        const int64_t s = off[fb], e = off[fb + 1];
        if (s == e) continue;
        const int64_t f = fb / B, t = m.ftable[f], D = m.dims[t];
        const float* g = grad + (fb - f * B) * m.total_dim + m.outoff[f];   // (D,) the bag's gradient
        if (m.fmean[f]) {
          const float len = static_cast<float>(e - s);
          for (int64_t d = 0; d < D; ++d) scaled[d] = g[d] / len;
          g = scaled.data();
        }
        bag_dots_dispatch<T>(W + m.woff[t], static_cast<uint64_t>(m.rows[t]), D, L.idx, s, e, off[(f + 1) * B],
                             near, far, g, blk, out);
      }
      if (blk.n) blk.flush(out);
    }
  });
}

NEO_KERNELS_END
