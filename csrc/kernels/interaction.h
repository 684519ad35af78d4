// DLRM's dot interaction, fused (one ISA variant): forward and backward of
//
//     v = [dense, pooled_1 .. pooled_F]            (B, n, D), n = F + 1
//     out = [dense, (v_i . v_j for i < j)]         (B, D + P), P = n (n - 1) / 2, pairs in
//                                                  row-major upper-triangle order
//
// without materializing v, the (B, n, n) Gram matrix or the concatenations. Samples are
// processed one at a time (their n vectors, 6.9 KB at n 27, D 64, stay in L1) and split over
// the torch threads.
//
// Arithmetic per sample: the forward is P dots of D floats (P D fused multiply-adds), the
// backward grad v_i = sum_{j != i} S[i][j] v_j with S the symmetric pair gradients (2 P D:
// the symmetric product, each multiply-add needed once). Both kernels issue exactly these
// and no more (no diagonal, no padding pairs). At n 27: 22.5 k + 44.9 k FMAs per sample at
// D 64. One Zen 4 core does 16 fp32 FMAs a cycle with AVX2 or with AVX-512 (512-bit
// operations take both 256-bit pipes; 57 G/s measured at 3.6 GHz), so the floor at B 2048
// is 0.8 + 1.6 ms at D 64 and 1.6 + 3.2 ms at D 128. Bytes: the forward reads n D and writes
// D + P floats a sample, the backward reads n D + D + P and writes n D: 17 + 31 MB at B 2048,
// D 64, which one core streams from DRAM in 0.6 + 1.1 ms (27 GB/s read, 29 read and
// streaming writes) if the kernels overlap the memory traffic with the arithmetic
// (NextSample) instead of following it. Measured with the data in L2: the forward at 66% of
// the FMA peak at D 64 (short dot products: the tiles' reductions and stores weigh) and 80%
// at D 128 on AVX-512, the backward at 90% (AVX2: 66/72% and 78%).
//
// Forward: pair dots in tiles of kFwdR rows x kFwdC columns of the upper triangle (2 x 4 on
// AVX2 and the baseline, 4 x 4 on AVX-512: the sums plus one 8-float vector of each operand
// row fit the register file). On AVX-512 the tiles take 16-float vectors instead where
// InteractionArgs::wide says so (D >= 96 on CPUs with two 512-bit FMA pipes, cpu_isa.h):
// half the multiply-adds, and one 16-way reduction tree (hsum16) per tile (Intel Xeon,
// B 2048, D 128: forward 10% faster with the batch in DRAM, 20% in cache; no faster at D 64,
// where the reductions weigh as much as the multiply-adds). A row block [i0, i0 + R) starts
// with the tile on the diagonal (columns i0 + 1 ..), of which only the pairs c >= r exist:
// the others are masked at compile time (no multiply-add, nothing stored); then whole
// tiles, and a narrower one at the row's end (the column count a template argument too):
// exactly P dots. Each step along D loads R + C vectors and issues R * C fused
// multiply-adds; a tile's sums are reduced horizontally eight at a time (a transposing tree
// of hadds) and stored row by row (a row's C results are contiguous in the output). On
// AVX-512 from D 16 to 95 (InteractionArgs::grouped) the grouped forward runs instead:
// rows interleaved four at a time, 4-way reductions (its section below).
//
// Backward: grad v_i = sum_j S[i][j] v_j in blocks of kBwdR rows x kBwdC vectors of D (6 x 2
// on AVX2: 12 sums + 2 operands + 1 broadcast; 6 x 4 on AVX-512), each j a broadcast of
// S[i][j] times the vectors of v_j. S is not built: the weights are read in place from the
// pair gradients (upper-triangle order), in three runs of j per block: j < i0 (S[i][j] =
// g(j, i), contiguous in i), the block's own rows (unrolled; the zero diagonal skipped), and
// j >= i0 + R (S[i][j] = g(i, j), one pointer per row). Rows are split into blocks of nearly
// equal size (27 = 6 + 6 + 5 + 5 + 5: no short block with too few sums to hide the FMA
// latency). The result is written straight into the (B, D) dense gradient (plus the dense
// part of grad_out passed through) and the pooled gradient (times grad_scale; streaming
// stores when it is large, see kStreamBytes).
//
// Memory: at B 2048 the inputs (13.6 MB at n 27, D 64) come from DRAM; the next sample's
// rows (and pair gradients) are prefetched into L2 while the current one computes
// (NextSample).
//
// Not done: a forward with one sample in each vector lane (the inputs transposed kW x kW, no
// horizontal sums). Built and measured on the Intel Xeon (docs/benchmarks.md, 2026-11-28
// 12:20 UTC): 1.3x (AVX-512) to 2x (AVX2) slower than these tiles. Under AVX2 the tiles
// already issue the minimum of 8-float multiply-adds (their reductions use port 5, beside the
// FMA ports); under AVX-512 the transposes' 512-bit shuffles take the ports the multiply-adds
// need (at best a fifth faster than the 16-float tiles, in theory).
//
// FMA is used (vfmadd); the result differs from torch's bmm path by summation order and
// rounding only (tested against the formula in float64). D not a multiple of kW: the last
// D % kW columns are summed in scalar code.
#pragma once

#include "util.h"

NEO_KERNELS_BEGIN

// Pointers to the n vectors of sample b.
inline void sample_rows(const InteractionArgs& a, int64_t b, const float** v) {
  v[0] = a.dense + b * a.D;
  for (int64_t k = 0; k < a.F; ++k) v[k + 1] = a.pooled + a.off[k] + b * a.stride[k];
}

// Index of pair (i, j), i < j, in row-major upper-triangle order, minus j: the pair
// gradient of (i, j) is g[pair_base(i, n) + j].
inline int64_t pair_base(int64_t i, int64_t n) { return i * (n - 1) - i * (i - 1) / 2 - i - 1; }

// Prefetches of the next sample into L2 while the current one computes: its n vectors and,
// in the backward, its pair gradients, spread over the current sample's work in Q shares
// (a burst of all of a sample's lines at once overflows the miss buffers: the forward at
// B 2048, D 128, AVX-512 then takes 3.7 ms instead of 2.5). Into L2, not L1: prefetcht0 or
// prefetchnta bring in the next sample over the current one (4.2 ms; without prefetches
// 4.9; the arithmetic alone about 2.0). The prefetches are asm statements
// (prefetch_lines_l2_kept): gcc deleted these loops of __builtin_prefetch.
//
// Share q of Q is either one burst of whole rows and pair-gradient lines (part(q): the
// forward, per row block; the backward on AVX2 and the baseline, per gradient block) or,
// where a gradient block's steps are long enough to carry a prefetch each (AVX-512: 24
// multiply-adds of 16 floats a step; AVX2's 12 of 8 slow down by a tenth), a line or a
// few of row j at each step j (row_share(q).row(j)) plus a burst of pair-gradient lines
// (grad_part(q)). Where the shares start is computed once per call (Plan): no divisions
// per sample.
class NextSample {
 public:
  struct Plan {
    std::vector<int64_t> row, grad_line, row_byte;   // share q: rows [row[q], row[q + 1]), ...
    Plan(int64_t n, int64_t D, int64_t grad_floats, int64_t Q) : row(Q + 1), grad_line(Q + 1), row_byte(Q + 1) {
      if (Q == 0) return;   // D < kW: no vector blocks, no shares
      const int64_t L = (D * 4 + 63) / 64, G = (grad_floats * 4 + 63) / 64;
      for (int64_t q = 0; q <= Q; ++q) {
        row[q] = n * q / Q;
        grad_line[q] = G * q / Q;
        row_byte[q] = L * q / Q * 64;
      }
    }
  };

  NextSample(const InteractionArgs& a, int64_t b, int64_t b1, const float* grad_out, int64_t grad_floats,
             const Plan& plan)
      : plan_(plan) {
    if (b >= b1) return;   // no next sample: nothing to prefetch
    n_ = a.F + 1;
    sample_rows(a, b, row_);
    row_bytes_ = a.D * 4;
    if (grad_out) grad_ = reinterpret_cast<const char*>(grad_out + b * grad_floats);
  }

  // Share q at once: whole rows and pair-gradient lines.
  void part(int64_t q) const {
    if (n_ == 0) return;
    for (int64_t r = plan_.row[q]; r < plan_.row[q + 1]; ++r) prefetch_lines_l2_kept(row_[r], row_bytes_);
    grad_part(q);
  }
  // Share q of the pair gradients.
  void grad_part(int64_t q) const {
    if (grad_) prefetch_lines_l2_kept(grad_ + plan_.grad_line[q] * 64, (plan_.grad_line[q + 1] - plan_.grad_line[q]) * 64);
  }
  // Share q per step: bytes [lo, hi) of row j at step j (a line, a few, or none).
  struct RowShare {
    const float* const* rows = nullptr;
    int64_t lo = 0, hi = 0;
    void row(int64_t j) const {
      if (hi > lo) prefetch_lines_l2_kept(reinterpret_cast<const char*>(rows[j]) + lo, hi - lo);
    }
  };
  RowShare row_share(int64_t q) const {
    return n_ == 0 ? RowShare{} : RowShare{row_, plan_.row_byte[q], plan_.row_byte[q + 1]};
  }

 private:
  const Plan& plan_;
  const float* row_[256];
  const char* grad_ = nullptr;
  int64_t n_ = 0, row_bytes_ = 0;   // n_ = 0: no next sample
};

// The current sample's rows from L2 (where NextSample put them) into L1 at once, as it
// starts (InteractionArgs::l1_burst, AMD family 19h only): its first row block reads every
// row, and there one miss after another to L2 costs more than a burst of prefetches that hit
// L2 (B 2048, D 64, AVX2 on Zen 4: forward and backward each about 5 to 8% faster). On an
// Intel Xeon (Emerald Rapids) the burst made both 5 to 8% slower at D 64 (the C++ probe of
// this header, alternating builds). Only for samples of at most kL1Burst bytes (6.9 KB at
// n 27, D 64): at D 128 (13.8 KB) the burst is no faster, or slower.
constexpr int64_t kL1Burst = 8 << 10;
inline void rows_into_l1(const InteractionArgs& a, const float* const* v, int64_t n, int64_t D) {
  if (!a.l1_burst || n * D * 4 > kL1Burst) return;
  for (int64_t r = 0; r < n; ++r) prefetch_lines_l1_kept(v[r], D * 4);
}

// The backward's prefetch per step (NextSample): where a gradient block step has at least
// 256 floats of multiply-adds.
constexpr bool kPrefetchPerStep = kBwdR * kBwdC * kW >= 256;

// ------------------------------------------------------------------------------ forward

// The vector operations of the forward's tiles: 8 floats (pv, every variant) or 16 (AVX-512).
struct NarrowVec {
  using V = pv;
  static constexpr int64_t kLanes = kPW;
  static V zero() { return pzero(); }
  static V load(const float* p) { return pload(p); }
  static V fmadd(V a, V b, V c) { return pfmadd(a, b, c); }
};
#if defined(__AVX512F__)
struct WideVec {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
#endif

// The sums of an R x C tile over the first Dv columns (a multiple of Vec::kLanes):
// acc[r * STRIDE + c] = lane-wise partial sums of v_{i0 + r} * v_{j0 + c}; every acc entry is
// zeroed first (the ones no pair uses stay zero). DIAG: only the pairs c >= r.
template <class Vec, int R, int C, int STRIDE, bool DIAG, int K>
inline void tile_sums(const float* const* ri, const float* const* cj, int64_t Dv, typename Vec::V (&acc)[K]) {
  using V = typename Vec::V;
  NEO_UNROLL
  for (int q = 0; q < K; ++q) acc[q] = Vec::zero();
  for (int64_t d = 0; d < Dv; d += Vec::kLanes) {
    V x[R], y[C];
    NEO_UNROLL
    for (int r = 0; r < R; ++r) x[r] = Vec::load(ri[r] + d);
    NEO_UNROLL
    for (int c = 0; c < C; ++c) {
      V t = Vec::load(cj[c] + d);
      keep_in_register(t);   // else gcc folds the load into each of the R multiply-adds: R times the loads
      y[c] = t;              // (on a copy: an asm operand in the array would keep the array in memory)
    }
    NEO_UNROLL
    for (int r = 0; r < R; ++r)
      NEO_UNROLL
      for (int c = 0; c < C; ++c)
        if (!DIAG || c >= r) acc[r * STRIDE + c] = Vec::fmadd(x[r], y[c], acc[r * STRIDE + c]);
  }
}

// The R x C pair tile at rows i0 .. i0 + R - 1, columns j0 .. j0 + C - 1 of the upper
// triangle, over the first Dv (a multiple of kPW) of the D columns:
// out[pair (i0 + r, j0 + c)] = v_{i0 + r} . v_{j0 + c}. DIAG: the tile on the diagonal
// (j0 = i0 + 1), where only c >= r are pairs; the others are neither computed nor stored.
// `row[r] + j` is where pair (i0 + r, j) goes.
template <int R, int C, bool DIAG>
inline void pair_tile(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row, int64_t j0) {
  constexpr int K = (R * C + 7) / 8 * 8;   // sums reduced eight at a time; the padding stays zero
  pv acc[K];
  tile_sums<NarrowVec, R, C, C, DIAG>(ri, cj, Dv, acc);
  alignas(32) float res[K];
  NEO_UNROLL
  for (int q = 0; q < K; q += 8) hsum8(acc + q, res + q);
  NEO_UNROLL
  for (int r = 0; r < R; ++r) {
    if (DIAG) {
      NEO_UNROLL
      for (int c = r; c < C; ++c) row[r][j0 + c] = res[r * C + c];
    } else {
      std::memcpy(row[r] + j0, res + r * C, C * sizeof(float));
    }
  }
}

#if defined(__AVX512F__)
// The same tile in 16-float vectors (AVX-512 variant, kFwdR = kFwdC = 4; where
// InteractionArgs::wide): R + C loads and R * C multiply-adds of 16 floats a step, then the 16
// sums (zero where the tile is smaller or a diagonal pair is absent) reduced by hsum16 into
// one vector, lane r * 4 + c = pair (i0 + r, j0 + c), and each row's lanes stored under a mask
// at row[r] + j0 - 4 r (where lane 0 goes when lane 4 r lands on row[r] + j0; masked-off lanes
// are not accessed, and the address stays inside the sample's output: at most 12 floats
// before its pairs, which follow its D >= 96 dense floats).
template <int R, int C, bool DIAG>
inline void pair_tile_wide(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row,
                           int64_t j0) {
  static_assert(R <= 4 && C <= 4, "wide tiles are at most 4 x 4");
  __m512 acc[16];
  tile_sums<WideVec, R, C, 4, DIAG>(ri, cj, Dv, acc);
  const __m512 sums = hsum16(acc);
  NEO_UNROLL
  for (int r = 0; r < R; ++r) {
    __mmask16 m = 0;
    for (int c = DIAG ? r : 0; c < C; ++c) m |= static_cast<__mmask16>(1u << (r * 4 + c));
    _mm512_mask_storeu_ps(row[r] + j0 - 4 * r, m, sums);
  }
}
constexpr bool kHaveWideForward = true;
#else
// Declared only, for pair_tile_any's discarded branch: never instantiated without AVX-512.
template <int R, int C, bool DIAG>
void pair_tile_wide(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row, int64_t j0);
constexpr bool kHaveWideForward = false;
#endif

// Vector width of the forward's tiles: 16 floats (WIDE, AVX-512 only) or kPW.
template <bool WIDE>
constexpr int64_t fwd_width() { return WIDE ? 16 : NarrowVec::kLanes; }

template <int R, int C, bool DIAG, bool WIDE>
inline void pair_tile_any(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row, int64_t j0) {
  if constexpr (WIDE) pair_tile_wide<R, C, DIAG>(ri, cj, Dv, row, j0);
  else pair_tile<R, C, DIAG>(ri, cj, Dv, row, j0);
}

// pair_tile with a compile-time column count C <= kFwdC chosen at run time (nc).
template <int R, bool DIAG, bool WIDE, int C = kFwdC>
inline void pair_tile_nc(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row, int64_t j0,
                         int64_t nc) {
  if constexpr (C > 1) {
    if (nc < C) return pair_tile_nc<R, DIAG, WIDE, C - 1>(ri, cj, Dv, row, j0, nc);
  }
  pair_tile_any<R, C, DIAG, WIDE>(ri, cj, Dv, row, j0);
}

// Row block [i0, i0 + R): the tile on the diagonal, whole tiles, a narrower one at the end.
template <int R, bool WIDE>
inline void pair_row_block(const float* const* v, int64_t n, int64_t Dv, int64_t i0, float* out) {
  constexpr int C = kFwdC;
  float* row[R];   // row[r][j] = pair (i0 + r, j)
  NEO_UNROLL
  for (int r = 0; r < R; ++r) row[r] = out + pair_base(i0 + r, n);
  const float* const* ri = v + i0;
  int64_t j0 = i0 + 1;
  pair_tile_nc<R, true, WIDE>(ri, v + j0, Dv, row, j0, n - j0);   // n - j0 >= R: every row has a pair
  for (j0 += C; j0 + C <= n; j0 += C) pair_tile_any<R, C, false, WIDE>(ri, v + j0, Dv, row, j0);
  if (j0 < n) pair_tile_nc<R, false, WIDE>(ri, v + j0, Dv, row, j0, n - j0);
}
template <bool WIDE, int R = kFwdR>
inline void pair_row_block_r(const float* const* v, int64_t n, int64_t Dv, int64_t i0, int64_t nr, float* out) {
  if constexpr (R > 1) {
    if (nr < R) return pair_row_block_r<WIDE, R - 1>(v, n, Dv, i0, nr, out);
  }
  pair_row_block<R, WIDE>(v, n, Dv, i0, out);
}

// Row blocks of the forward (the shares of its prefetches).
inline int64_t pair_row_blocks(int64_t n) { return (n - 1 + kFwdR - 1) / kFwdR; }

// out[p] += the pair's dot over the columns [Dv, D) the vector tiles left out (scalar code).
inline void add_tail_dots(const float* const* v, int64_t n, int64_t Dv, int64_t D, float* out) {
  if (Dv == D) return;
  for (int64_t i = 0, p = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j, ++p) {
      float s = 0.0f;
      for (int64_t d = Dv; d < D; ++d) s += v[i][d] * v[j][d];
      out[p] += s;
    }
}

// out[p] = v_i . v_j over pairs i < j, p in row-major upper-triangle order (rows 0 .. n - 2:
// row n - 1 has no pair to its right); the last D % fwd_width columns added in scalar code.
template <bool WIDE>
inline void pair_dots(const float* const* v, int64_t n, int64_t D, float* out, NextSample&& next) {
  const int64_t Dv = D / fwd_width<WIDE>() * fwd_width<WIDE>();
  for (int64_t k = 0, i0 = 0; i0 < n - 1; ++k, i0 += kFwdR) {
    next.part(k);
    pair_row_block_r<WIDE>(v, n, Dv, i0, std::min<int64_t>(kFwdR, n - 1 - i0), out);
  }
  add_tail_dots(v, n, Dv, D, out);
}


// ------------------------------------------------------------- forward, grouped (AVX-512)

#if defined(__AVX512F__)
// The grouped forward (InteractionArgs::grouped; AVX-512, D < 96 on Intel: cpu_isa.h). Rows
// are taken four at a time and interleaved by 4-float chunks: T[a] = [r0 chunk a, r1 chunk a,
// r2 chunk a, r3 chunk a], one 16-float vector (a 4 x 4 transpose of 128-bit blocks per 16
// columns, 8 shuffles, once per group of rows). A column row's chunk a is broadcast to the
// four 128-bit lanes (a load, no shuffle), so one multiply-add advances the dots of four
// pairs (the group's rows against one column) by four columns each, and a tile's sums need
// only a 4-way reduction within 128-bit lanes (sum_quads: 6 shuffles and 3 adds for 16 pairs,
// where hsum16 takes 30 and 15). Two groups (8 rows) share each column's broadcasts: 2 + C
// loads and 2 C multiply-adds a step for C columns. Against the 8-float tiles at D 64 on the
// Intel Xeon (Emerald Rapids), one thread (docs/benchmarks.md, 2026-11-28 21:10 UTC): a
// sample's arithmetic (in L1) 24% less time, a batch of 2048 in L2 16% less, in
// tools/bench_interaction.py 8% less; with the batch in L3 or DRAM the same (bound by memory
// there). D 32 to 80: 7 to 24% less than the better of the 8- and 16-float tiles; at D 128
// no faster than the 16-float tiles (the transposes weigh as much as the reductions saved).

// T[a] for a < Dv / 4 from rows r[0..3] (Dv a multiple of 16; T 64-byte aligned).
inline void interleave_rows4(const float* const* r, int64_t Dv, float* T) {
  for (int64_t d = 0; d < Dv; d += 16) {
    const __m512 x0 = _mm512_loadu_ps(r[0] + d), x1 = _mm512_loadu_ps(r[1] + d);
    const __m512 x2 = _mm512_loadu_ps(r[2] + d), x3 = _mm512_loadu_ps(r[3] + d);
    const __m512 t0 = _mm512_shuffle_f32x4(x0, x1, 0x44), t1 = _mm512_shuffle_f32x4(x0, x1, 0xEE);  // x0 c0 c1 x1 c0 c1 | c2 c3
    const __m512 t2 = _mm512_shuffle_f32x4(x2, x3, 0x44), t3 = _mm512_shuffle_f32x4(x2, x3, 0xEE);
    float* o = T + d * 4;
    _mm512_store_ps(o, _mm512_shuffle_f32x4(t0, t2, 0x88));         // chunk 0 of x0 x1 x2 x3
    _mm512_store_ps(o + 16, _mm512_shuffle_f32x4(t0, t2, 0xDD));    // chunk 1
    _mm512_store_ps(o + 32, _mm512_shuffle_f32x4(t1, t3, 0x88));    // chunk 2
    _mm512_store_ps(o + 48, _mm512_shuffle_f32x4(t1, t3, 0xDD));    // chunk 3
  }
}

// Lane 4 r + c of the result = the sum of 128-bit lane r of a_c (c = 0..3).
inline __m512 sum_quads(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));   // a0 02, a1 02, a0 13, a1 13
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512d x = _mm512_castps_pd(s01), y = _mm512_castps_pd(s23);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}

// G interleaved groups (T[g]) x columns cj[0..C) starting at column j0: pair (row r of group
// g, column j0 + c) goes to rows[g][r] + j0 + c. The last group may be partial (R rows) and,
// where DIAG, sits on the diagonal (its row r pairs only with columns c >= r).
template <int G, int R, int C, bool DIAG>
inline void group_tile(const float* const* T, const float* const* cj, int64_t Dv, float* (*rows)[4],
                       int64_t j0) {
  constexpr int Q = (C + 3) / 4;   // column quads; a partial quad's missing sums stay zero
  __m512 acc[G][Q * 4];
  NEO_UNROLL
  for (int g = 0; g < G; ++g)
    NEO_UNROLL
    for (int c = 0; c < Q * 4; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t a = 0, A = Dv / 4; a < A; ++a) {
    __m512 x[G];
    NEO_UNROLL
    for (int g = 0; g < G; ++g) x[g] = _mm512_load_ps(T[g] + a * 16);
    NEO_UNROLL
    for (int c = 0; c < C; ++c) {
      const __m512 y = _mm512_broadcast_f32x4(_mm_loadu_ps(cj[c] + 4 * a));
      NEO_UNROLL
      for (int g = 0; g < G; ++g) acc[g][c] = _mm512_fmadd_ps(x[g], y, acc[g][c]);
    }
  }
  NEO_UNROLL
  for (int g = 0; g < G; ++g) {
    const bool last = g == G - 1;
    NEO_UNROLL
    for (int q = 0; q < Q; ++q) {
      const __m512 s = sum_quads(acc[g][4 * q], acc[g][4 * q + 1], acc[g][4 * q + 2], acc[g][4 * q + 3]);
      NEO_UNROLL
      for (int r = 0; r < 4; ++r) {
        if (last && r >= R) break;
        unsigned m = 0;   // compile-time after unrolling
        for (int c = 0; c < 4; ++c)
          if (4 * q + c < C && !(DIAG && last && 4 * q + c < r)) m |= 1u << (4 * r + c);
        // Lane 4 r lands on rows[g][r] + j0 + 4 q; masked-off lanes are not accessed.
        if (m) _mm512_mask_storeu_ps(rows[g][r] + j0 + 4 * q - 4 * r, static_cast<__mmask16>(m), s);
      }
    }
  }
}

// group_tile with a compile-time column count C <= 8 chosen at run time (nc).
template <int G, int R, bool DIAG, int C = 8>
inline void group_tile_nc(const float* const* T, const float* const* cj, int64_t Dv, float* (*rows)[4],
                          int64_t j0, int64_t nc) {
  if constexpr (C > 1) {
    if (nc < C) return group_tile_nc<G, R, DIAG, C - 1>(T, cj, Dv, rows, j0, nc);
  }
  group_tile<G, R, C, DIAG>(T, cj, Dv, rows, j0);
}

// Rows [i0, i0 + 4 G) (the last group has R rows with pairs; the others 4): interleaved into
// T (4 Dv floats a group), then the tiles of their columns i0 + 1 .. n - 1.
template <int G, int R>
inline void group_block(const float* const* v, int64_t n, int64_t Dv, int64_t i0, float* out, float* T) {
  const float* Tg[G];
  float* rows[G][4];
  NEO_UNROLL
  for (int g = 0; g < G; ++g) {
    const float* r4[4];
    for (int r = 0; r < 4; ++r) {
      const int64_t i = i0 + 4 * g + r;
      r4[r] = v[std::min<int64_t>(i, n - 1)];        // a row past the pairs: any row (its sums are not stored)
      rows[g][r] = out + pair_base(std::min<int64_t>(i, n - 2), n);
    }
    Tg[g] = T + g * 4 * Dv;
    interleave_rows4(r4, Dv, T + g * 4 * Dv);
  }
  int64_t j0 = i0 + 1;
  if constexpr (G == 2) {   // the first group's 4 diagonal columns alone, then both groups
    group_tile<1, 4, 4, true>(Tg, v + j0, Dv, rows, j0);
    j0 += 4;
  }
  group_tile_nc<G, R, true>(Tg, v + j0, Dv, rows, j0, n - j0);   // on the last group's diagonal
  for (j0 += 8; j0 + 8 <= n; j0 += 8) group_tile<G, R, 8, false>(Tg, v + j0, Dv, rows, j0);
  if (j0 < n) group_tile_nc<G, R, false>(Tg, v + j0, Dv, rows, j0, n - j0);
}

// out[p] = v_i . v_j over pairs i < j as pair_dots does, in blocks of 8 rows (then 4 or fewer);
// T: 8 Dv floats of 64-byte aligned scratch.
inline void grouped_dots(const float* const* v, int64_t n, int64_t D, float* out, NextSample&& next, float* T) {
  const int64_t Dv = D / 16 * 16;
  for (int64_t k = 0, i0 = 0; i0 < n - 1; ++k) {   // share k of the prefetches per 4 rows (pair_row_blocks)
    const int64_t left = n - 1 - i0;
    next.part(k);
    if (left >= 8) {
      next.part(++k);
      group_block<2, 4>(v, n, Dv, i0, out, T);
      i0 += 8;
      continue;
    }
    switch (std::min<int64_t>(left, 4)) {
      case 4: group_block<1, 4>(v, n, Dv, i0, out, T); break;
      case 3: group_block<1, 3>(v, n, Dv, i0, out, T); break;
      case 2: group_block<1, 2>(v, n, Dv, i0, out, T); break;
      default: group_block<1, 1>(v, n, Dv, i0, out, T); break;
    }
    i0 += 4;
  }
  add_tail_dots(v, n, Dv, D, out);
}
constexpr bool kHaveGroupedForward = true;
#else
// Declared only: never called without AVX-512 (InteractionArgs::grouped is false there).
inline void grouped_dots(const float* const* v, int64_t n, int64_t D, float* out, NextSample&& next, float* T) {}
constexpr bool kHaveGroupedForward = false;
#endif

void interaction_forward(const InteractionArgs& a, float* out) {
  const int64_t D = a.D, n = a.F + 1, P = n * (n - 1) / 2;
  const NextSample::Plan plan(n, D, 0, pair_row_blocks(n));   // a share per row block
  const bool grouped = kHaveGroupedForward && a.grouped;
  at::parallel_for(0, a.B, 64, [&](int64_t b0, int64_t b1) {
    const float* v[256];
    // The grouped forward's interleaved rows: 8 Dv floats, 64-byte aligned.
    std::unique_ptr<float[]> T_owner(grouped ? new float[8 * D + 16] : nullptr);
    float* T = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(T_owner.get()) + 63) & ~uintptr_t(63));
    for (int64_t b = b0; b < b1; ++b) {
      sample_rows(a, b, v);
      rows_into_l1(a, v, n, D);
      float* o = out + b * (D + P);
      std::memcpy(o, v[0], D * sizeof(float));
      NextSample next(a, b + 1, b1, nullptr, 0, plan);
      if (grouped) grouped_dots(v, n, D, o + D, std::move(next), T);
      else if (kHaveWideForward && a.wide) pair_dots<kHaveWideForward>(v, n, D, o + D, std::move(next));
      else pair_dots<false>(v, n, D, o + D, std::move(next));
    }
  });
}

// ------------------------------------------------------------------------------ backward

// Where block rows go: row 0 (dense) = add0 + sum; rows k >= 1 = sum * scale.
struct GradOut {
  float* const* out;
  const float* add0;
  float scale;
  bool stream;
};

// acc[r][.] += w_r * x[.] for the R rows of a block.
template <int R, int C>
inline void grad_step(vf (&acc)[R][C], const vf (&x)[C], const float* w, int64_t w_stride) {
  NEO_UNROLL
  for (int r = 0; r < R; ++r) {
    const vf wr = vset1(w[r * w_stride]);
    NEO_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = vfmadd(wr, x[c], acc[r][c]);
  }
}

// Rows [i0, i0 + R) x columns [d0, d0 + C * kW) of S v, the weights S[i][j] read from the
// pair gradients g (upper-triangle order) in place; next.row(j) at each j. FIRST: the block
// holds row 0 (i0 = 0), the dense row, a compile-time fact: the stores need no test per row,
// and the rows' output pointers are read before the streaming stores (which could alias
// them for all the compiler knows): backward 3-4% faster at D 64 and 128 on AVX2.
template <int R, int C, bool STREAM, bool FIRST>
inline void grad_block(const float* const* v, int64_t n, const float* g, int64_t i0, int64_t d0, const GradOut& go,
                       const NextSample::RowShare& next) {
  vf acc[R][C];
  NEO_UNROLL
  for (int r = 0; r < R; ++r)
    NEO_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  vf x[C];
  // j < i0: S[i0 + r][j] = g(j, i0 + r) = g[pair_base(j) + i0 + r], contiguous in r.
  int64_t base_j = pair_base(0, n);
  for (int64_t j = 0; j < i0; ++j) {
    if constexpr (kPrefetchPerStep) next.row(j);
    NEO_UNROLL
    for (int c = 0; c < C; ++c) x[c] = vload(v[j] + d0 + c * kW);
    grad_step<R, C>(acc, x, g + base_j + i0, 1);
    base_j += n - 2 - j;   // pair_base(j + 1)
  }
  // The block's own rows j = i0 + k: S[i0 + r][j] = g(min, max), zero on the diagonal.
  int64_t base_r[R];
  NEO_UNROLL
  for (int r = 0; r < R; ++r) base_r[r] = pair_base(i0 + r, n);
  NEO_UNROLL
  for (int k = 0; k < R; ++k) {
    if constexpr (kPrefetchPerStep) next.row(i0 + k);
    NEO_UNROLL
    for (int c = 0; c < C; ++c) x[c] = vload(v[i0 + k] + d0 + c * kW);
    NEO_UNROLL
    for (int r = 0; r < R; ++r) {
      if (r == k) continue;
      const vf w = vset1(r < k ? g[base_r[r] + i0 + k] : g[base_r[k] + i0 + r]);
      NEO_UNROLL
      for (int c = 0; c < C; ++c) acc[r][c] = vfmadd(w, x[c], acc[r][c]);
    }
  }
  // j >= i0 + R: S[i0 + r][j] = g(i0 + r, j) = g[pair_base(i0 + r) + j]: one row of g per r.
  const float* gr[R];
  NEO_UNROLL
  for (int r = 0; r < R; ++r) gr[r] = g + base_r[r];
  for (int64_t j = i0 + R; j < n; ++j) {
    if constexpr (kPrefetchPerStep) next.row(j);
    NEO_UNROLL
    for (int c = 0; c < C; ++c) x[c] = vload(v[j] + d0 + c * kW);
    NEO_UNROLL
    for (int r = 0; r < R; ++r) {
      const vf w = vset1(gr[r][j]);
      NEO_UNROLL
      for (int c = 0; c < C; ++c) acc[r][c] = vfmadd(w, x[c], acc[r][c]);
    }
  }
  float* out[R];
  NEO_UNROLL
  for (int r = 0; r < R; ++r) out[r] = go.out[i0 + r] + d0;
  const vf scale = vset1(go.scale);
  NEO_UNROLL
  for (int r = 0; r < R; ++r) {
    const bool dense = FIRST && r == 0;   // compile-time after unrolling
    NEO_UNROLL
    for (int c = 0; c < C; ++c) {
      const vf y = dense ? vadd(vload(go.add0 + d0 + c * kW), acc[r][c]) : vmul(acc[r][c], scale);
      if (STREAM && !dense) vstream(out[r] + c * kW, y);
      else vstore(out[r] + c * kW, y);
    }
  }
}

// Compile-time C for the columns' remainder, then R.
template <int R, int C = kBwdC>
inline void grad_block_c(const float* const* v, int64_t n, const float* g, int64_t i0, int64_t d0, int64_t nc,
                         const GradOut& go, const NextSample::RowShare& next) {
  if constexpr (C > 1) {
    if (nc < C) return grad_block_c<R, C - 1>(v, n, g, i0, d0, nc, go, next);
  }
  if (i0 == 0) {
    if (go.stream) grad_block<R, C, true, true>(v, n, g, i0, d0, go, next);
    else grad_block<R, C, false, true>(v, n, g, i0, d0, go, next);
  } else {
    if (go.stream) grad_block<R, C, true, false>(v, n, g, i0, d0, go, next);
    else grad_block<R, C, false, false>(v, n, g, i0, d0, go, next);
  }
}
template <int R = kBwdR>
inline void grad_block_rc(const float* const* v, int64_t n, const float* g, int64_t i0, int64_t d0, int64_t nr,
                          int64_t nc, const GradOut& go, const NextSample::RowShare& next) {
  if constexpr (R > 1) {
    if (nr < R) return grad_block_rc<R - 1>(v, n, g, i0, d0, nr, nc, go, next);
  }
  grad_block_c<R>(v, n, g, i0, d0, nc, go, next);
}

// Row blocks of a sample: n / blocks or n / blocks + 1 rows each, at most kBwdR.
inline int64_t grad_row_blocks(int64_t n) { return (n + kBwdR - 1) / kBwdR; }

// Gradient blocks of a sample (the backward's shares of the prefetches).
inline int64_t grad_blocks(int64_t n, int64_t D) { return grad_row_blocks(n) * ((D / kW + kBwdC - 1) / kBwdC); }

// grad v_i = sum_j S[i][j] v_j for every i, written as GradOut says; g: the sample's pair
// gradients (P floats, upper-triangle order); S: n * n floats of scratch where D % kW != 0.
inline void grad_rows(const float* const* v, int64_t n, int64_t D, const float* g, const GradOut& go,
                      NextSample&& next, float* S) {
  const int64_t Dv = D / kW * kW, blocks = grad_row_blocks(n);
  for (int64_t k = 0, q = 0; k < blocks; ++k) {
    const int64_t i0 = n * k / blocks, nr = n * (k + 1) / blocks - i0;
    for (int64_t d0 = 0; d0 < Dv; d0 += kBwdC * kW, ++q) {
      NextSample::RowShare rows;
      if constexpr (kPrefetchPerStep) {
        next.grad_part(q);
        rows = next.row_share(q);
      } else {
        next.part(q);
      }
      grad_block_rc(v, n, g, i0, d0, nr, std::min<int64_t>(kBwdC, (Dv - d0) / kW), go, rows);
    }
  }
  if (Dv == D) return;
  // The last D % kW columns, in scalar code, with S (n, n) written out: S[i][j] = the pair
  // gradient of (min(i, j), max(i, j)), zero on the diagonal.
  for (int64_t i = 0; i < n; ++i) {
    S[i * n + i] = 0.0f;
    for (int64_t j = i + 1; j < n; ++j) S[i * n + j] = S[j * n + i] = g[pair_base(i, n) + j];
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = Dv; d < D; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) acc += S[i * n + j] * v[j][d];
      go.out[i][d] = i == 0 ? go.add0[d] + acc : acc * go.scale;
    }
}

// The pooled gradient is written with non-temporal (streaming) stores when it is large
// (at least kStreamBytes) and its rows are aligned to the vector width: no read for
// ownership of lines about to be overwritten, and megabytes of gradient do not evict the
// cache's working set (backward at B 2048: 5% faster at D 64, 25% at D 128).
constexpr int64_t kStreamBytes = int64_t(4) << 20;

void interaction_backward(const InteractionArgs& a, const float* grad_out, float* grad_dense, float* grad_pooled,
                          float scale) {
  const int64_t D = a.D, n = a.F + 1, P = n * (n - 1) / 2;
  const NextSample::Plan plan(n, D, D + P, grad_blocks(n, D));   // a share per gradient block
  const bool large = a.B * a.F * D * 4 >= kStreamBytes && D % kW == 0;
  at::parallel_for(0, a.B, 64, [&](int64_t b0, int64_t b1) {
    const float* v[256];
    float* outs[256];
    std::vector<float> S(D % kW ? n * n : 0);
    for (int64_t b = b0; b < b1; ++b) {
      sample_rows(a, b, v);
      rows_into_l1(a, v, n, D);
      const float* g = grad_out + b * (D + P);
      outs[0] = grad_dense + b * D;
      for (int64_t k = 0; k < a.F; ++k) outs[k + 1] = grad_pooled + a.off[k] + b * a.stride[k];
      bool stream = large;
      for (int64_t k = 1; k <= a.F && stream; ++k) stream = reinterpret_cast<uintptr_t>(outs[k]) % (kW * 4) == 0;
      grad_rows(v, n, D, g + D, GradOut{outs, g, scale, stream}, NextSample(a, b + 1, b1, grad_out, D + P, plan),
                S.data());
    }
    vsfence();
  });
}

NEO_KERNELS_END
