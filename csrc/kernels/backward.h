// Fused backward + sparse optimizer step (one ISA variant). No dense weight gradient is
// ever formed.
//
// 1. Keys (parallel over bags): for every id, its global row key = row_offsets[t] + id
//    (ids outside [0, rows) get a sentinel key past every row, so they sort last and are
//    skipped), packed as (key << 32 | ref) with ref = its bag (unweighted) or its position
//    (weighted: the bag of each position kept aside). Per bag:
//    the offset of its slice of grad_output and its length for mean pooling (F * B
//    entries, cache-resident).
// 2. Grouping: stable parallel LSD radix sort of the packed items by key (radix_sort.h),
//    only as many key bits as the largest key needs; where the features' tables ascend,
//    each table's items sort alone by their local row (sort_table_segments). Occurrences of
//    one row end up adjacent, in order of occurrence.
// 3. Update (parallel over segments of the sorted items, cut at row boundaries, about equally
//    many ids each). Weighted ids first get their bag back into ref and their weight into an
//    array in sorted order (one pass of independent reads, before the update: the update then
//    reads them in order, as the unweighted one reads its refs; each read through the position
//    in the update was a random access the row's gradient waited on: the weighted update took
//    1.35-1.43x the unweighted one's time, docs/benchmarks.md). Per row, sum its gradient
//    occurrences in fp32 (same order as the reference), then apply the optimizer to the row in
//    place (optimizers.h): weights in their storage dtype (stochastic rounding of fp16/bf16
//    keyed by (seed, step, element)), state in fp32. fp32 rows of up to kRowRegs vectors (D <=
//    64 on AVX2, <= 128 on AVX-512) are summed in registers, and under SGD, Adagrad or row-wise
//    Adagrad (no weight decay) updated from there too (update_row_regs); other rows go through a
//    thread-local D-vector and update_row (fp16 rows summed in registers were 10% slower:
//    row-wise Adagrad with stochastic rounding, 8 tables of 1M rows, AVX2). The row 16 rows ahead
//    (24 on AMD Zen 5, 8 on Intel: cpu_isa.cpp default_tuning) is prefetched into L1 (weights and
//    state with write intent, its first gradient slice, both of a row of two), and, on batches not
//    too sparse in rows, the weight and state rows 128 rows ahead into L2 (not fp32 rows on AMD
//    Zen 5): rows are random in a large table, so this phase is bound by memory latency; the
//    distances count rows, not items (update_segment). Common D (16, 32, 64, 128) get
//    compile-time row lengths (straight-line vector code).
//
// Results do not depend on the number of threads, nor on the variant: every row is summed
// and updated by one thread, in a fixed order, with the same IEEE operations (no FMA:
// -ffp-contract=off), so fp16/bf16 weights match the reference bit for bit.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "optimizers.h"
#include "radix_sort.h"

NEO_KERNELS_BEGIN

// NEO_PROFILE=1 in the environment: print the time of each phase to stderr (diagnostics).
static const bool kProfile = std::getenv("NEO_PROFILE") != nullptr;
using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Workspace {
  Buffer<uint64_t> a, b;
  Buffer<uint32_t> bag_of;    // weighted only: bag of each position
  Buffer<float> sorted_w;     // weighted only: weight of each sorted item
  Buffer<int64_t> bag_goff;   // per bag: offset of its slice of grad_output
  Buffer<float> bag_len;      // per bag: its length for mean pooling, 0 for sum
};
thread_local Workspace tls_ws;

// Where a bag's gradient comes from (phase 1's per-bag tables, phase 2's sorted items).
struct Sources {
  const float* grad;
  const uint64_t* sorted;     // (key << 32 | bag), weighted ones too (see backward_impl)
  const float* sorted_w;      // weighted: the weight of each sorted item
  const int64_t* bag_goff;
  const float* bag_len;
};

// fp32 rows of at most this many vectors are summed in registers (process_row).
constexpr int kRowRegs = 8;

// The occurrences sorted[j ..] of row `key` summed into g (V vectors), in order of
// occurrence, with the operations of process_row's loop below. Returns the index past them.
template <int V, bool WEIGHTED>
inline int64_t sum_row_regs(const Sources& src, int64_t j, int64_t end, uint64_t key, vf (&g)[V]) {
  NEO_UNROLL
  for (int v = 0; v < V; ++v) g[v] = vzero();
  do {
    const uint32_t fb = static_cast<uint32_t>(src.sorted[j]);   // the item's bag
    const float* go = src.grad + src.bag_goff[fb];
    const float len = src.bag_len[fb];
    if (WEIGHTED) {
      const vf w = vset1(src.sorted_w[j]);
      if (len != 0.0f) {
        const vf l = vset1(len);
        NEO_UNROLL
        for (int v = 0; v < V; ++v) g[v] = vadd(g[v], vmul(vdiv(vload(go + v * kW), l), w));
      } else {
        NEO_UNROLL
        for (int v = 0; v < V; ++v) g[v] = vadd(g[v], vmul(vload(go + v * kW), w));
      }
    } else if (len != 0.0f) {
      const vf l = vset1(len);
      NEO_UNROLL
      for (int v = 0; v < V; ++v) g[v] = vadd(g[v], vdiv(vload(go + v * kW), l));
    } else {
      NEO_UNROLL
      for (int v = 0; v < V; ++v) g[v] = vadd(g[v], vload(go + v * kW));
    }
    ++j;
  } while (j < end && (src.sorted[j] >> 32) == key);
  return j;
}

// sum_squares (optimizers.h) of the V vectors g, the same bits, without storing them: its
// lanes 0-7 and 8-15 are the two halves of one AVX-512 vector, or AVX2's even and odd
// vectors. Stored to `scratch` and reloaded in 8-float halves (the baseline's way), the
// 512-bit stores did not forward to the 256-bit loads: 15% of the row update's samples on an
// AMD EPYC (Zen 5), row-wise Adagrad, 8 tables of 1M rows, D 64.
template <int V>
inline float sum_squares_regs(const vf (&g)[V], float* scratch) {
#if defined(__AVX512F__)
  (void)scratch;
  vf acc = vmul(g[0], g[0]);
  NEO_UNROLL
  for (int v = 1; v < V; ++v) acc = vadd(acc, vmul(g[v], g[v]));
  return sum_lanes8(_mm256_add_ps(_mm512_castps512_ps256(acc),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))));
#elif defined(__AVX2__)
  (void)scratch;
  vf lo = vmul(g[0], g[0]), hi = vzero();
  NEO_UNROLL
  for (int v = 1; v < V; ++v) {
    if (v % 2) hi = vadd(hi, vmul(g[v], g[v]));
    else lo = vadd(lo, vmul(g[v], g[v]));
  }
  return sum_lanes8(_mm256_add_ps(lo, hi));
#else
  NEO_UNROLL
  for (int v = 0; v < V; ++v) vstore(scratch + v * kW, g[v]);
  return sum_squares(scratch, V * kW);
#endif
}

// SGD, Adagrad or row-wise Adagrad on an fp32 row from its gradient sum in registers:
// update_row's operations, in its order (so the same bits), without its round trips through
// memory (row-wise: its sum of squares in registers, sum_squares_regs). False (nothing
// done) for the other optimizers and for weight decay.
template <int V>
inline bool update_row_regs(const OptParams& o, float* w, float* s0, const vf (&g)[V], float* scratch) {
  if (o.has_wd || (o.kind != kSGD && o.kind != kAdagrad && o.kind != kRowwiseAdagrad)) return false;
  const vf lr = vset1(o.lr);
  if (o.kind == kSGD) {
    NEO_UNROLL
    for (int v = 0; v < V; ++v) vstore(w + v * kW, vsub(vload(w + v * kW), vmul(lr, g[v])));
    return true;
  }
  if (o.kind == kRowwiseAdagrad) {
    const float mean = sum_squares_regs<V>(g, scratch) / static_cast<float>(V * kW);
    const float s = s0[0] + mean;
    s0[0] = s;
    const vf scale = vset1((1.0f / (std::sqrt(s) + o.eps)) * o.lr);
    NEO_UNROLL
    for (int v = 0; v < V; ++v) vstore(w + v * kW, vsub(vload(w + v * kW), vmul(scale, g[v])));
    return true;
  }
  const vf eps = vset1(o.eps);
  NEO_UNROLL
  for (int v = 0; v < V; ++v) {
    const vf s = vadd(vload(s0 + v * kW), vmul(g[v], g[v]));
    vstore(s0 + v * kW, s);
    vstore(w + v * kW, vsub(vload(w + v * kW), vdiv(vmul(lr, g[v]), vadd(vsqrt(s), eps))));
  }
  return true;
}

// One row: sum its occurrences sorted[j ..] (same key) in fp32, in order of occurrence,
// then apply the optimizer. Returns the index past the row's occurrences. fp32 rows short
// enough are summed in registers, and updated from there where update_row_regs can: the
// backward at B 4096 x 4 tables of 100k rows, 20 ids a bag, D 64, one thread, AVX2: SGD
// 11.9 -> 11.1 ms, Adagrad 19.3 -> 16.7, row-wise Adagrad 13.5 -> 12.2 (medians of three
// runs of each build, alternating).
template <int64_t DC, bool WEIGHTED, typename T>
inline int64_t process_row(const UpdateArgs& u, T* W, const Sources& src, int64_t j, int64_t end, uint64_t key,
                           int64_t D_, int64_t elem0, float* a, float* wf) {
  const int64_t D = DC ? DC : D_;
  float* st0 = u.s0 ? (u.rowwise_state ? u.s0 + key : u.s0 + elem0) : nullptr;
  float* st1 = u.s1 ? u.s1 + elem0 : nullptr;
  if constexpr (std::is_same_v<T, float> && DC > 0 && DC % kW == 0 && DC / kW <= kRowRegs) {
    constexpr int V = DC / kW;
    vf g[V];
    j = sum_row_regs<V, WEIGHTED>(src, j, end, key, g);
    if (update_row_regs<V>(u.opt, W + elem0, st0, g, a)) return j;
    NEO_UNROLL
    for (int v = 0; v < V; ++v) vstore(a + v * kW, g[v]);
    update_row<DC>(u.opt, W + elem0, a, st0, st1, wf, D, u.stochastic, u.sr_key, elem0);
    return j;
  }
  for (int64_t d = 0; d < D; ++d) a[d] = 0.0f;
  do {
    const uint32_t fb = static_cast<uint32_t>(src.sorted[j]);   // the item's bag
    const float* go = src.grad + src.bag_goff[fb];
    const float len = src.bag_len[fb];
    if (WEIGHTED) {
      const float w = src.sorted_w[j];
      if (len != 0.0f) for (int64_t d = 0; d < D; ++d) a[d] += (go[d] / len) * w;
      else for (int64_t d = 0; d < D; ++d) a[d] += go[d] * w;
    } else {
      if (len != 0.0f) for (int64_t d = 0; d < D; ++d) a[d] += go[d] / len;
      else for (int64_t d = 0; d < D; ++d) a[d] += go[d];
    }
    ++j;
  } while (j < end && (src.sorted[j] >> 32) == key);
  update_row<DC>(u.opt, W + elem0, a, st0, st1, wf, D, u.stochastic, u.sr_key, elem0);
  return j;
}

inline int bit_width(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

// Phase 1: keys and gradient sources of every id; returns the invalid count and max key.
template <bool WEIGHTED>
void make_keys(const GroupMeta& m, const Lookup& L, uint64_t* items, uint32_t* bag_of, int64_t* bag_goff,
               float* bag_len, int64_t& n_invalid, uint64_t& max_key) {
  const int64_t B = m.B, nbags = m.F * B, N = L.off[nbags];
  const uint64_t sentinel = static_cast<uint64_t>(m.total_rows);
  const int64_t chunks = num_chunks(N + nbags, 1 << 14);
  const std::vector<int64_t> starts = split_bags_by_ids(L.off, nbags, chunks);
  std::vector<int64_t> invalid(chunks, 0);
  std::vector<uint64_t> mks(chunks, 0);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t bad = 0;
      uint64_t mk = 0;
      for (int64_t fb = starts[c]; fb < starts[c + 1]; ++fb) {
        const int64_t f = fb / B, b = fb - f * B;
        const int64_t t = m.ftable[f];
        const uint64_t rows = static_cast<uint64_t>(m.rows[t]), r0 = static_cast<uint64_t>(m.roff[t]);
        const int64_t s = L.off[fb], e = L.off[fb + 1];
        bag_goff[fb] = b * m.total_dim + m.outoff[f];
        bag_len[fb] = m.fmean[f] ? static_cast<float>(e - s) : 0.0f;
        for (int64_t i = s; i < e; ++i) {
          const uint64_t id = static_cast<uint64_t>(L.idx[i]);
          uint64_t key = sentinel;
          if (id < rows) key = r0 + id; else ++bad;
          mk = std::max(mk, key);
          items[i] = (key << 32) | static_cast<uint64_t>(WEIGHTED ? i : fb);
          if (WEIGHTED) bag_of[i] = static_cast<uint32_t>(fb);
        }
      }
      invalid[c] = bad;
      mks[c] = mk;
    }
  });
  n_invalid = 0;
  max_key = 0;
  for (int64_t c = 0; c < chunks; ++c) { n_invalid += invalid[c]; max_key = std::max(max_key, mks[c]); }
}

// The items of each table, where the features' tables ascend (consecutive features of one
// table share a segment): then the items are grouped by table already, in key order. Empty
// (sort the whole range) otherwise.
inline std::vector<KeySegment> table_segments(const GroupMeta& m, const Lookup& L) {
  std::vector<KeySegment> segs;
  for (int64_t f = 0; f < m.F; ++f) {
    const int64_t t = m.ftable[f], s = L.off[f * m.B], e = L.off[(f + 1) * m.B];
    const uint64_t base = static_cast<uint64_t>(m.roff[t]), rows = static_cast<uint64_t>(m.rows[t]);
    if (!segs.empty() && segs.back().base == base) {
      segs.back().end = e;
      continue;
    }
    if (!segs.empty() && base < segs.back().base + segs.back().rows) return {};
    segs.push_back({s, e, base, rows});
  }
  return segs;
}

// Phase 3 on sorted items [j, end): sum per row and update, with prefetches ahead.
template <typename T, bool WEIGHTED>
void update_segment(const GroupMeta& m, T* W, const UpdateArgs& u, const Sources& src, int64_t j, int64_t end,
                    int64_t n_valid, int64_t lookahead, int64_t far, float* acc, float* wf) {
  const uint64_t* sorted = src.sorted;
  const bool rowwise = u.rowwise_state;
  int64_t t = 0;
  // table of a sorted key at or after the current one (keys ascend), and its first element
  auto locate = [&](uint64_t k, int64_t& tt) {
    while (k >= static_cast<uint64_t>(m.roff[tt] + m.rows[tt])) ++tt;
    return m.woff[tt] + (static_cast<int64_t>(k) - m.roff[tt]) * m.dims[tt];
  };
  // the first item of the row after the one that starts at p (or n_valid)
  auto next_row = [&](int64_t p) {
    const uint64_t k = sorted[p] >> 32;
    do ++p; while (p < n_valid && (sorted[p] >> 32) == k);
    return p;
  };
  // Prefetch cursors: the first items of the rows `lookahead` and `far` rows ahead, each moved on
  // by one row per row updated. Counted in items (the item `lookahead` places after a row's
  // first), as they were until 2026-12-05, they left rows unprefetched wherever row lengths vary:
  // the rows after a long one, and any row whose first item no row start lay `lookahead` items
  // before (a 40% share of the single-item rows among 5-item ones). Each such row's update waited
  // on memory: one table of Zipf(1.05) ids, 31k rows of 102k ids, updated in 1.50 ms, now 0.66;
  // uniform ids (6% of rows with two or more) 2.06 -> 1.46-1.55 ms (docs/benchmarks.md).
  int64_t pj = j, pf = j;
  for (int64_t r = 0; r < lookahead && pj < n_valid; ++r) pj = next_row(pj);
  if (far)
    for (int64_t r = 0; r < far && pf < n_valid; ++r) pf = next_row(pf);
  while (j < end) {
    const uint64_t key = sorted[j] >> 32;
    const int64_t elem0 = locate(key, t);
    const int64_t D = m.dims[t];
    if (pj < n_valid) {  // into L1: the row, its state and its first gradient slice, L rows ahead
      const uint64_t it2 = sorted[pj], k2 = it2 >> 32;
      int64_t t2 = t;
      const int64_t e2 = locate(k2, t2), D2 = m.dims[t2];
      prefetch_row_w(W + e2, D2 * static_cast<int64_t>(sizeof(T)));
      if (rowwise) {
        __builtin_prefetch(u.s0 + k2, 1, 3);
      } else if (u.s0) {
        prefetch_row_w(u.s0 + e2, D2 * 4);
        if (u.s1) prefetch_row_w(u.s1 + e2, D2 * 4);
      }
      prefetch_row(src.grad + src.bag_goff[static_cast<uint32_t>(it2)], D2 * 4);
      // A row of two occurrences: its second gradient slice too. The update's loads of a row's
      // slices wait on the row's bag lookups, and after a row of one or two items the core has
      // little else to run meanwhile (a sampling profile put about a quarter of the update's
      // samples on the slices' loads and their bags' offsets). Intel Xeon (Emerald Rapids), 4
      // tables of 100k rows, bags of 1-39 uniform ids (bench_sharded's shape, 1.5 items a row),
      // the same process alternating (2026-12-06): the backward 4-6% faster under AVX2 at one
      // thread (row-wise Adagrad and SGD), 3-4% under AVX-512 at one and two; 8 tables of 1M rows
      // (1.04 items a row) and 2 of 10k (8 a row) within 0.5%. Every occurrence's slice instead:
      // 5% slower at 8 a row (docs/benchmarks.md).
      const int64_t next = next_row(pj);   // the cursor moves on to the row after it
      if (next - pj == 2) prefetch_row(src.grad + src.bag_goff[static_cast<uint32_t>(sorted[pj + 1])], D2 * 4);
      pj = next;
    }
    if (far && pf < n_valid) {  // into L2: weight and element-wise state rows `far` rows ahead
      int64_t t3 = t;
      const int64_t e3 = locate(sorted[pf] >> 32, t3), D3 = m.dims[t3];
      prefetch_row_w_l2(W + e3, D3 * static_cast<int64_t>(sizeof(T)));
      if (u.s0 && !rowwise) {
        prefetch_row_w_l2(u.s0 + e3, D3 * 4);
        if (u.s1) prefetch_row_w_l2(u.s1 + e3, D3 * 4);
      }
    }
    switch (D) {  // compile-time row lengths for the common D
      case 16: j = process_row<16, WEIGHTED>(u, W, src, j, end, key, D, elem0, acc, wf); break;
      case 32: j = process_row<32, WEIGHTED>(u, W, src, j, end, key, D, elem0, acc, wf); break;
      case 64: j = process_row<64, WEIGHTED>(u, W, src, j, end, key, D, elem0, acc, wf); break;
      case 128: j = process_row<128, WEIGHTED>(u, W, src, j, end, key, D, elem0, acc, wf); break;
      default: j = process_row<0, WEIGHTED>(u, W, src, j, end, key, D, elem0, acc, wf); break;
    }
    if (far && pf < n_valid) pf = next_row(pf);
  }
}

// Items are (key << 32 | ref). Unweighted: ref = the id's bag; weighted: ref = its position
// until the sort is done, then its bag (and its weight in sorted_w). Either way refs increase
// with the position, so the stable sort keeps occurrences of a row in order of occurrence.
template <typename T, bool WEIGHTED>
int64_t backward_impl(const GroupMeta& m, T* W, const Lookup& L, const UpdateArgs& u) {
  const int64_t nbags = m.F * m.B, N = L.off[nbags];
  if (N == 0) return 0;
  Workspace& ws = tls_ws;
  uint64_t* items = ws.a.get(N);
  uint64_t* tmp = ws.b.get(N);
  uint32_t* bag_of = WEIGHTED ? ws.bag_of.get(N) : nullptr;
  int64_t* bag_goff = ws.bag_goff.get(nbags);
  float* bag_len = ws.bag_len.get(nbags);

  auto t0 = Clock::now();
  int64_t n_invalid = 0;
  uint64_t mk = 0;
  make_keys<WEIGHTED>(m, L, items, bag_of, bag_goff, bag_len, n_invalid, mk);
  const int64_t n_valid = N - n_invalid;
  if (n_valid == 0) return n_invalid;
  const double ms1 = ms_since(t0);
  const std::vector<KeySegment> segs = n_invalid == 0 ? table_segments(m, L) : std::vector<KeySegment>{};
  const uint64_t* sorted = segs.empty() ? radix_sort_by_key(items, tmp, N, bit_width(mk))
                                        : sort_table_segments(items, tmp, segs);
  const double ms2 = ms_since(t0);

  // segments of the sorted items, cut at row boundaries
  const int64_t seg = num_chunks(n_valid, 1 << 12);
  std::vector<int64_t> bounds(seg + 1);
  bounds[0] = 0;
  bounds[seg] = n_valid;
  for (int64_t c = 1; c < seg; ++c) {
    int64_t p = std::max(bounds[c - 1], n_valid * c / seg);
    while (p > 0 && p < n_valid && (sorted[p] >> 32) == (sorted[p - 1] >> 32)) ++p;
    bounds[c] = p;
  }
  const int64_t lookahead = tuning().bwd_lookahead;
  // A second prefetch 8x further ahead, into L2, keeps more misses in flight when the batch
  // touches a fair share of the rows: 13% faster at 326k ids over 400k rows, 25% at 655k ids
  // over 8M rows (row-wise Adagrad, 1 thread: 59 -> 44 ms). On sparser batches (one-hot ids
  // over 1.3M rows: 4%) it cost about 10%, so it runs only from 1/16 as many ids as rows.
  // Its distance: kBwdFar rows; for fp32 tables tuning().bwd_far, kBwdFar but 0 (none) on AMD Zen 5
  // (family 1Ah, default_tuning) and Zen 3 (the same measured there: 8-10% faster without it on
  // 328k ids over 400k rows, 2026-12-07). On Zen 5, 655k ids over 8M rows of D 64, row-wise Adagrad,
  // bwd_far 0 against 128 in one process, alternating, FBGEMM's time as the yardstick
  // (2026-12-02): fp32 tables 2-8% faster at 1 thread (six runs), 1-5% at 2 (three); fp16
  // tables (rows of two lines, not four) 1-8% slower at 1 thread (three), 4-8% faster at 2.
  // Without it the L1 prefetch goes further ahead there (bwd_lookahead 24, default_tuning): the
  // same workload, fp32, forward + backward at one thread, 16 against 24 items ahead (the
  // distances counted items then: on this workload, whose ids are nearly all of distinct rows,
  // about as many rows), runs in call_orders' order beside FBGEMM (2026-12-05): 28.16 -> 27.05,
  // 28.99 -> 27.87, 28.78 -> 27.79 ms at 20 ids a bag; 2% faster at 5 ids a bag; within the
  // noise at one id a bag (4% either way in four runs), at two threads and with fp16 tables
  // (which keep the far prefetch); 32 and 48 items ahead no better than 24. Rechecked with the
  // distances in rows (2026-12-05): bwd_far 128 still 1.1-1.2x slower for fp32 tables there, and
  // 12, 40 or 64 rows ahead no better than 24.
  const int64_t far_rows = std::is_same_v<T, float> ? tuning().bwd_far : kBwdFar;
  const int64_t far = n_valid * 16 >= m.total_rows ? far_rows : 0;
  float* sorted_w = nullptr;
  if constexpr (WEIGHTED) {   // position -> (bag, weight), in sorted order: independent reads, in parallel
    sorted_w = ws.sorted_w.get(n_valid);
    uint64_t* items_sorted = const_cast<uint64_t*>(sorted);   // one of this thread's own buffers
    at::parallel_for(0, n_valid, 1 << 14, [&](int64_t a, int64_t b) {
      for (int64_t j = a; j < b; ++j) {
        const uint64_t it = items_sorted[j];
        const uint32_t pos = static_cast<uint32_t>(it);
        sorted_w[j] = L.psw[pos];
        items_sorted[j] = (it & ~static_cast<uint64_t>(0xffffffffu)) | bag_of[pos];
      }
    });
  }
  const Sources src{u.grad, sorted, sorted_w, bag_goff, bag_len};
  at::parallel_for(0, seg, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> acc(m.max_dim), wf(m.max_dim);
    for (int64_t c = c0; c < c1; ++c)
      update_segment<T, WEIGHTED>(m, W, u, src, bounds[c], bounds[c + 1], n_valid, lookahead, far, acc.data(),
                                  wf.data());
  });
  if (kProfile) fprintf(stderr, "bwd: keys %.2f sort %.2f update %.2f ms\n", ms1, ms2 - ms1, ms_since(t0) - ms2);
  return n_invalid;
}

template <typename T>
int64_t backward(const GroupMeta& m, T* W, const Lookup& L, const UpdateArgs& u) {
  return L.psw ? backward_impl<T, true>(m, W, L, u) : backward_impl<T, false>(m, W, L, u);
}

NEO_KERNELS_END
