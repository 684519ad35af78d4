// Pooled forward lookup of all features of a group in one call (one ISA variant).
//
// Work: the (feature, bag) pairs are cut into one contiguous range per thread holding
// about equally many ids (at::parallel_for, so torch.set_num_threads applies). A range is
// walked feature by feature: the table, row length and pooling of a feature are resolved
// once, then its bags run through a loop specialised for that row length.
//
// Per bag the fp32 sum stays in registers: NV = D / kW vectors (fp16 / bf16 rows widened
// in registers), NV <= kPoolMaxNV (16 on AVX-512: D <= 256; 8 on AVX2 and the baseline),
// wider rows in passes of kPoolMaxNV vectors over the bag (the later passes hit rows the
// first one brought into cache). D not a multiple of the vector width sums into the output
// row in L1 with plain loops.
//
// Memory: random rows of a large table are a DRAM miss each, so the gather is bound by how
// many misses are in flight. The rows of the ids P ahead (P = tuning().fwd_prefetch, same
// feature) are prefetched into L1 and those F ahead into L2 (F = tuning().fwd_far, 0: none), by
// default 32 and 256 ids. fp32 tables have distances of their own (fwd_prefetch32, fwd_far32): on
// AMD Zen 3 16 and none, which ran their 4-line rows from 1% slower to 9% faster at one thread
// and 4-12% faster at two (16-bit rows of two lines: 10% slower without the L2 prefetch;
// docs/benchmarks.md, 2026-12-07).
//
// Instructions: a core shared with another hardware thread (a busy neighbour on a VM) issues
// fewer of them, and then a gather with more instructions per id than the probe falls behind
// it. So the loop of a bag whose prefetch targets all lie inside its feature's ids (every bag
// but the last few of a feature) tests neither the bounds nor the prefetched ids: a prefetch
// never faults, and an id out of range is caught before its row is read. With the tables in
// L2 (instruction-bound) that loop took 0.87x (AVX2) and 0.90x (AVX-512) the time of the
// checked one at fp16; from DRAM the two were within 2% (docs/benchmarks.md).
//
// Stores: where a feature's pooled rows are whole 64-byte-aligned cache lines (D * 4 a
// multiple of 64, the output's row stride and column offset too), they are written with
// streaming stores: no read-for-ownership of output lines that are written whole, which is up to
// a tenth of the memory traffic of an fp16 gather (a 256-byte output row per bag of ~20
// 128-byte rows). Measured on the Intel Xeon (AVX2 kernels, 8 tables of 1M rows, D 64, bags
// of 20): forward 0.95x / 0.96x the time at 1 / 2 threads fp16, 0.97x / 0.96x fp32; the
// multi-hot DLRM step of tools/bench_train.py 0.93-0.97x, one-hot 0.98-1.04x (docs/benchmarks.md).
// Each thread fences its streaming stores before the threads join.
//
// An id outside [0, rows) contributes zero and is counted; the count is returned so the
// caller can notice bad input cheaply. No FMA (the file is compiled with -ffp-contract=off):
// `acc + row * weight` rounds the product and the sum separately, as the reference does, so
// the pooled output equals the reference to the last bit.
#pragma once

#include "util.h"

NEO_KERNELS_BEGIN

// Consecutive bags [fb0, fb1) of one feature, as one thread pools them.
struct FeatureRun {
  const int64_t* idx;
  const float* psw;
  const int64_t* off;
  int64_t rows, D, fend;   // fend: end of the feature's ids (prefetches stay inside the feature)
  bool mean;
  int64_t fb0, fb1;
  float* out;              // output row of bag fb0 (this feature's columns)
  int64_t out_stride;      // floats between the output rows of consecutive bags
  int64_t near, far;       // prefetch distances in ids (L1, L2; far 0: no L2 prefetch)
  bool stream;             // pooled rows written with streaming stores (whole aligned lines)
};

// Prefetch of the row of id `pid` (if valid) into L1 (LOCALITY 3) or L2 (1), BYTES known at
// compile time where the row length is (straight-line prefetches), else row_bytes.
template <int64_t BYTES, int LOCALITY, typename T>
inline void prefetch_id(const T* table, int64_t D, uint64_t rows, int64_t pid, int64_t row_bytes) {
  if (__builtin_expect(static_cast<uint64_t>(pid) >= rows, 0)) return;
  const char* p = reinterpret_cast<const char*>(table + pid * D);
  if constexpr (BYTES > 0) {
    for (int64_t o = 0; o < BYTES; o += 64) __builtin_prefetch(p + o, 0, LOCALITY);
  } else {
    prefetch_lines<0, LOCALITY>(p, row_bytes);
  }
}

// Sum of one bag's rows over columns [c0, c0 + NV * kW), in NV registers, into o + c0.
// Inlined into the loop over bags: no call, no spill of the sums per bag. FIRST: the pass
// that prefetches (the later column passes of wide rows find the rows in cache). DK: the row
// length where the caller knows it is NV * kW (0: r.D, read at run time). With DK the row
// address is a shift, not a multiply, and no test of the row length stays in the loop: the
// compiler cannot carry a test of r.D made outside into the loop (the output stores might
// alias r). Measured on the AVX2 fp16 loop: it had a multiply and a test per id without it.
template <typename T, bool WEIGHTED, int NV, bool FIRST, int64_t DK = 0>
__attribute__((always_inline)) inline int64_t pool_bag(const T* table, const FeatureRun& r, int64_t s, int64_t e,
                                                       int64_t c0, float* o) {
  static_assert(DK == 0 || DK == NV * kW, "DK: rows of exactly NV vectors");
  const uint64_t rows = static_cast<uint64_t>(r.rows);
  const int64_t D = DK ? DK : r.D, row_bytes = D * static_cast<int64_t>(sizeof(T)), fend = r.fend;
  const int64_t near = r.near, far = r.far;
  const int64_t* idx = r.idx;
  // whole rows of exactly NV vectors: the prefetched length is a constant. (Deriving it from
  // row_bytes instead, with prefetch_lines and without `exact`, looks simpler but changed
  // GCC's inlining: the fp16 loops ran 1.04-1.09x slower with the tables in L2.)
  constexpr int64_t kBytes = FIRST ? NV * kW * static_cast<int64_t>(sizeof(T)) : 0;
  const bool exact = DK != 0 || D == NV * kW;
  vf acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = vzero();
  int64_t bad = 0;
  // one id's row into the sums; an id out of range adds nothing and is counted
  auto add = [&](int64_t i) __attribute__((always_inline)) {
    const int64_t id = idx[i];
    if (__builtin_expect(static_cast<uint64_t>(id) >= rows, 0)) { ++bad; return; }
    const T* row = table + id * D + c0;
    if (WEIGHTED) {
      const vf w = vset1(r.psw[i]);
      for (int v = 0; v < NV; ++v) acc[v] = vadd(acc[v], vmul(vload(row + v * kW), w));
    } else {
      for (int v = 0; v < NV; ++v) acc[v] = vadd(acc[v], vload(row + v * kW));
    }
  };
  int64_t i0 = s;
  if constexpr (FIRST && DK != 0) {
    if (e + std::max(near, far) <= fend) {   // every prefetch of the bag inside the feature's ids: no bound tests
      const char* base = reinterpret_cast<const char*>(table);
      for (; i0 < e; ++i0) {
        // ids unchecked: a prefetch never faults, and a bad id's row is skipped by add()
        const char* pn = base + static_cast<uint64_t>(idx[i0 + near]) * kBytes;
        for (int64_t b = 0; b < kBytes; b += 64) __builtin_prefetch(pn + b, 0, 3);
        if (far != 0) {
          const char* pf = base + static_cast<uint64_t>(idx[i0 + far]) * kBytes;
          for (int64_t b = 0; b < kBytes; b += 64) __builtin_prefetch(pf + b, 0, 1);
        }
        add(i0);
      }
    }
  }
  for (int64_t i = i0; i < e; ++i) {
    if (FIRST) {   // the branches' likely ways first: the prefetches stay in the loop's straight path
      if (__builtin_expect(i + near < fend, 1)) {
        if (exact) prefetch_id<kBytes, 3>(table, D, rows, idx[i + near], row_bytes);
        else prefetch_id<0, 3>(table, D, rows, idx[i + near], row_bytes);
      }
      if (far != 0 && __builtin_expect(i + far < fend, 1)) {
        if (exact) prefetch_id<kBytes, 1>(table, D, rows, idx[i + far], row_bytes);
        else prefetch_id<0, 1>(table, D, rows, idx[i + far], row_bytes);
      }
    }
    add(i);
  }
  if (r.mean && e > s) {
    const vf len = vset1(static_cast<float>(e - s));
    for (int v = 0; v < NV; ++v) acc[v] = vdiv(acc[v], len);
  }
  if (r.stream) {
    for (int v = 0; v < NV; ++v) vstream(o + c0 + v * kW, acc[v]);
  } else {
    for (int v = 0; v < NV; ++v) vstore(o + c0 + v * kW, acc[v]);
  }
  return FIRST ? bad : 0;
}

// Every bag of the run, rows of exactly NV vectors (NV <= kPoolMaxNV): one pass each.
template <typename T, bool WEIGHTED, int NV>
int64_t pool_run(const T* table, const FeatureRun& r) {
  int64_t bad = 0;
  float* o = r.out;
  for (int64_t fb = r.fb0; fb < r.fb1; ++fb, o += r.out_stride)
    bad += pool_bag<T, WEIGHTED, NV, true, NV * kW>(table, r, r.off[fb], r.off[fb + 1], 0, o);
  return bad;
}

// One pass of NV vectors (runtime nv in [1, kPoolMaxNV]) over a bag, for wide rows.
template <typename T, bool WEIGHTED, int NV = 1>
int64_t pool_pass(const T* table, const FeatureRun& r, int nv, int64_t s, int64_t e, int64_t c0, bool first, float* o) {
  if constexpr (NV >= kPoolMaxNV) {
    return first ? pool_bag<T, WEIGHTED, kPoolMaxNV, true>(table, r, s, e, c0, o)
                 : pool_bag<T, WEIGHTED, kPoolMaxNV, false>(table, r, s, e, c0, o);
  } else {
    if (nv != NV) return pool_pass<T, WEIGHTED, NV + 1>(table, r, nv, s, e, c0, first, o);
    return first ? pool_bag<T, WEIGHTED, NV, true>(table, r, s, e, c0, o)
                 : pool_bag<T, WEIGHTED, NV, false>(table, r, s, e, c0, o);
  }
}

// Rows wider than kPoolMaxNV vectors: passes of kPoolMaxNV vectors (the last one shorter).
template <typename T, bool WEIGHTED>
int64_t pool_run_wide(const T* table, const FeatureRun& r) {
  int64_t bad = 0;
  float* o = r.out;
  const int64_t nv_total = r.D / kW;
  for (int64_t fb = r.fb0; fb < r.fb1; ++fb, o += r.out_stride) {
    for (int64_t v0 = 0; v0 < nv_total; v0 += kPoolMaxNV) {
      const int nv = static_cast<int>(std::min<int64_t>(kPoolMaxNV, nv_total - v0));
      bad += pool_pass<T, WEIGHTED>(table, r, nv, r.off[fb], r.off[fb + 1], v0 * kW, v0 == 0, o);
    }
  }
  return bad;
}

// Any D (a multiple of 4, not of the vector width): the sum is kept in the output row (L1).
template <typename T, bool WEIGHTED>
int64_t pool_run_generic(const T* table, const FeatureRun& r, float* buf) {
  const uint64_t rows = static_cast<uint64_t>(r.rows);
  const int64_t D = r.D, row_bytes = D * static_cast<int64_t>(sizeof(T));
  int64_t bad = 0;
  float* o = r.out;
  for (int64_t fb = r.fb0; fb < r.fb1; ++fb, o += r.out_stride) {
    const int64_t s = r.off[fb], e = r.off[fb + 1];
    for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
    for (int64_t i = s; i < e; ++i) {
      if (i + r.near < r.fend) {
        const int64_t pid = r.idx[i + r.near];
        if (static_cast<uint64_t>(pid) < rows) prefetch_row(table + pid * D, row_bytes);
      }
      if (r.far != 0 && i + r.far < r.fend) {
        const int64_t pid = r.idx[i + r.far];
        if (static_cast<uint64_t>(pid) < rows) prefetch_row_l2(table + pid * D, row_bytes);
      }
      const int64_t id = r.idx[i];
      if (static_cast<uint64_t>(id) >= rows) { ++bad; continue; }
      const float* x = row_f32(table + id * D, buf, D);
      if (WEIGHTED) {
        const float w = r.psw[i];
        for (int64_t d = 0; d < D; ++d) o[d] += x[d] * w;
      } else {
        for (int64_t d = 0; d < D; ++d) o[d] += x[d];
      }
    }
    if (r.mean && e > s) {
      const float len = static_cast<float>(e - s);
      for (int64_t d = 0; d < D; ++d) o[d] = o[d] / len;
    }
  }
  return bad;
}

// Row length -> the specialised loop (NV = D / kW chosen at compile time).
template <typename T, bool WEIGHTED, int NV = 1>
int64_t pool_run_dispatch(const T* table, const FeatureRun& r, float* buf) {
  if constexpr (NV > kPoolMaxNV) {
    return r.D % kW == 0 ? pool_run_wide<T, WEIGHTED>(table, r) : pool_run_generic<T, WEIGHTED>(table, r, buf);
  } else {
    if (r.D == NV * kW) return pool_run<T, WEIGHTED, NV>(table, r);
    return pool_run_dispatch<T, WEIGHTED, NV + 1>(table, r, buf);
  }
}

template <typename T>
int64_t forward(const GroupMeta& m, const T* W, const Lookup& L, float* out) {
  const int64_t B = m.B, nbags = m.F * B;
  const int64_t* off = L.off;
  const int64_t chunks = num_chunks(off[nbags] - off[0] + nbags, 2048);
  const std::vector<int64_t> starts = split_bags_by_ids(off, nbags, chunks);
  std::vector<int64_t> invalid(chunks, 0);
  const Tuning& tune = tuning();
  const bool f32 = std::is_same_v<T, float>;
  const int64_t near = std::max<int64_t>(1, f32 ? tune.fwd_prefetch32 : tune.fwd_prefetch);
  const int64_t far = std::max<int64_t>(0, f32 ? tune.fwd_far32 : tune.fwd_far);
  const bool lines = tune.fwd_stream != 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0 && m.total_dim % 16 == 0;
  // whole cache lines: the row stride, and (per feature) the row length and column offset
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> buf(m.max_dim);
    bool streamed = false;
    for (int64_t c = c0; c < c1; ++c) {
      int64_t bad = 0;
      for (int64_t fb = starts[c]; fb < starts[c + 1];) {
        const int64_t f = fb / B, t = m.ftable[f], D = m.dims[t];
        const bool stream = lines && D % 16 == 0 && m.outoff[f] % 16 == 0;
        FeatureRun r{L.idx, L.psw, off, m.rows[t], D, off[(f + 1) * B], m.fmean[f] != 0,
                     fb, std::min(starts[c + 1], (f + 1) * B), out + (fb - f * B) * m.total_dim + m.outoff[f],
                     m.total_dim, near, far, stream};
        const T* table = W + m.woff[t];
        bad += L.psw ? pool_run_dispatch<T, true>(table, r, buf.data()) : pool_run_dispatch<T, false>(table, r, buf.data());
        streamed |= stream;
        fb = r.fb1;
      }
      invalid[c] = bad;
    }
    if (streamed) vsfence();   // this thread's streaming stores, before the join publishes the output
  });
  int64_t total = 0;
  for (int64_t v : invalid) total += v;
  return total;
}

NEO_KERNELS_END
