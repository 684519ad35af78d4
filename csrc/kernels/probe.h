// Memory probes. The machine's random-row gather speed (tools/bench_gather_probe.py): the
// plainest possible gather, against which the forward lookup's lookups/s are reported; and
// the dot interaction's traffic alone (below).
//
// Rows ids[0..n) of row_bytes bytes each are read and summed as 32-bit integers into one
// vector register per thread (integer adds: garbage float bits could hit slow denormal
// paths), the ids split into one contiguous range per torch thread. Rows `near` ids ahead
// are prefetched into L1 and rows `far` ids ahead further out (0 turns either off): with
// `far_hint` 1 prefetcht1 (L2), 2 prefetcht2, 0 prefetchnta, and only every `far_every`-th
// line of the row (1: every line; 2: every other, leaving the adjacent-line prefetcher the
// rest); the benchmark takes the best of several such schedules. No bags, no output. An id
// outside [0, rows) is counted and its row not read (a compare and a branch per id, as in the
// forward's loop; the caller raises on a count above zero): no pass over the ids before the
// gather. Until 2026-12-05 the probe checked the ids in a pass of their own (at::aminmax:
// 0.18 ms of a 655k-id batch, 4% of the fp32 probe and 8% of the fp16 one on AMD EPYC
// 26/2/1 at one thread), so a forward, which does not, could read faster than it.
#pragma once

#include "interaction_backward.h"   // large_pooled_gradient
#include "util.h"

NEO_KERNELS_BEGIN

// Rows ids[s, e) of BYTES bytes (0: row_bytes, known only at run time) summed into acc; the
// far prefetches with locality hint HINT, every EVERY-th line (0: `every`, known only at run
// time; the default, every line, is compiled straight-line like the near prefetches).
// An id out of range counts in bad and adds nothing (its prefetches never fault: the
// address is only computed).
template <int64_t BYTES, int HINT, int EVERY>
inline vi probe_range(const uint8_t* table, int64_t row_bytes, uint64_t rows, const int64_t* ids, int64_t s,
                      int64_t e, int64_t near, int64_t far, int64_t every, vi acc, int64_t& bad) {
  const int64_t rb = BYTES ? BYTES : row_bytes, step = 64 * (EVERY ? EVERY : every);
  const auto row = [&](int64_t id) { return table + static_cast<uint64_t>(id) * static_cast<uint64_t>(rb); };
  for (int64_t i = s; i < e; ++i) {
    if (near && i + near < e) {
      const uint8_t* p = row(ids[i + near]);
      for (int64_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o, 0, 3);
    }
    if (far && i + far < e) {
      const uint8_t* p = row(ids[i + far]);
      for (int64_t o = 0; o < rb; o += step) __builtin_prefetch(p + o, 0, HINT);
    }
    const int64_t id = ids[i];
    if (__builtin_expect(static_cast<uint64_t>(id) >= rows, 0)) { ++bad; continue; }
    const uint8_t* r = row(id);
    for (int64_t o = 0; o < rb; o += static_cast<int64_t>(sizeof(vi))) acc = viadd(acc, viload(r + o));
  }
  return acc;
}

// The arguments of probe_range that stay fixed over a call.
struct ProbeRange {
  const uint8_t* table;
  int64_t row_bytes;
  uint64_t rows;
  const int64_t* ids;
  int64_t near, far, every;
};

// probe_range with the common row sizes unrolled, as the forward's are.
template <int HINT, int EVERY>
inline vi probe_rows(const ProbeRange& p, int64_t s, int64_t e, vi acc, int64_t& bad) {
#define NEO_PROBE_RANGE(BYTES) \
  probe_range<BYTES, HINT, EVERY>(p.table, p.row_bytes, p.rows, p.ids, s, e, p.near, p.far, p.every, acc, bad)
  switch (p.row_bytes) {
    case 128: return NEO_PROBE_RANGE(128);
    case 256: return NEO_PROBE_RANGE(256);
    case 512: return NEO_PROBE_RANGE(512);
    case 1024: return NEO_PROBE_RANGE(1024);
    default: return NEO_PROBE_RANGE(0);
  }
#undef NEO_PROBE_RANGE
}
template <int HINT>
inline vi probe_rows_hint(const ProbeRange& p, int64_t s, int64_t e, vi acc, int64_t& bad) {
  return p.every == 1 ? probe_rows<HINT, 1>(p, s, e, acc, bad) : probe_rows<HINT, 0>(p, s, e, acc, bad);
}

uint64_t gather_probe(const uint8_t* table, int64_t row_bytes, int64_t rows, const int64_t* ids, int64_t n,
                      int64_t near, int64_t far, int64_t far_hint, int64_t far_every, int64_t* invalid) {
  const int64_t chunks = num_chunks(n, 4096);
  std::vector<uint64_t> sums(chunks, 0);
  std::vector<int64_t> bad(chunks, 0);
  const ProbeRange p{table, row_bytes, static_cast<uint64_t>(rows), ids, near, far, far_every};
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t s = n * c / chunks, e = n * (c + 1) / chunks;
      vi acc = vizero();
      switch (far_hint) {   // the locality hint is an immediate operand
        case 0: acc = probe_rows_hint<0>(p, s, e, acc, bad[c]); break;
        case 2: acc = probe_rows_hint<2>(p, s, e, acc, bad[c]); break;
        default: acc = probe_rows_hint<1>(p, s, e, acc, bad[c]); break;
      }
      uint32_t lanes[sizeof(vi) / 4];
      std::memcpy(lanes, &acc, sizeof(acc));
      for (uint32_t x : lanes) sums[c] += x;
    }
  });
  uint64_t total = 0;
  for (uint64_t x : sums) total += x;
  *invalid = 0;
  for (int64_t x : bad) *invalid += x;
  return total;
}

// The dot interaction's memory traffic alone (tools/bench_interaction.py --bounds): the
// bytes interaction_forward and interaction_backward read and write (interaction.h) on a
// contiguous (B, F * D) pooled tensor, with the same stores (streaming for a large pooled
// gradient, kStreamBytes) and the same split of the samples over the torch threads; the only
// arithmetic is a sum that keeps the loads. Each sample's F pooled vectors are read as one
// span (the fastest way to read them: per-vector loops took 15% longer at n 27, D 64). What
// it takes is the kernels' memory floor measured on this machine; a floor from a copy's
// bandwidth is only a model.

// acc + the m floats at p (any m).
inline vf traffic_sum(const float* p, int64_t m, vf acc) {
  int64_t k = 0;
  for (; k + kW <= m; k += kW) acc = vadd(acc, vload(p + k));
  float tail = 0.0f;
  for (; k < m; ++k) tail += p[k];
  return vadd(acc, vset1(tail));
}

// y into the m floats at p (any m; streaming stores where STREAM, p then kW-float aligned).
template <bool STREAM>
inline void traffic_fill(float* p, int64_t m, vf y) {
  int64_t k = 0;
  for (; k + kW <= m; k += kW) {
    if constexpr (STREAM) vstream(p + k, y);
    else vstore(p + k, y);
  }
  for (; k < m; ++k) p[k] = 0.0f;
}

// a.pooled must be a contiguous (B, F * D) tensor (the entry point checks).
void interaction_traffic_forward(const InteractionArgs& a, float* out) {
  const int64_t D = a.D, FD = a.F * a.D, n = a.F + 1, W = D + n * (n - 1) / 2;
  at::parallel_for(0, a.B, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const vf acc = traffic_sum(a.pooled + b * FD, FD, traffic_sum(a.dense + b * D, D, vzero()));
      traffic_fill<false>(out + b * W, W, acc);
    }
  });
}

void interaction_traffic_backward(const InteractionArgs& a, const float* grad_out, float* grad_dense,
                                  float* grad_pooled, float /*scale*/) {
  const int64_t D = a.D, FD = a.F * a.D, n = a.F + 1, W = D + n * (n - 1) / 2;
  // As interaction_backward: streaming stores for a large pooled gradient of aligned rows.
  const bool stream = large_pooled_gradient(a) && reinterpret_cast<uintptr_t>(grad_pooled) % (kW * 4) == 0;
  at::parallel_for(0, a.B, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      vf acc = traffic_sum(grad_out + b * W, W, vzero());
      acc = traffic_sum(a.pooled + b * FD, FD, traffic_sum(a.dense + b * D, D, acc));
      traffic_fill<false>(grad_dense + b * D, D, acc);
      if (stream) traffic_fill<true>(grad_pooled + b * FD, FD, acc);
      else traffic_fill<false>(grad_pooled + b * FD, FD, acc);
    }
    vsfence();
  });
}

NEO_KERNELS_END
