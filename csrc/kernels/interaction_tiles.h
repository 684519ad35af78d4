// The dot interaction forward in register tiles of the upper triangle: 8-float vectors in
// every variant, 16-float ones on AVX-512 ("narrow" and "wide"; interaction.h describes
// both), and the scalar tail columns every forward adds last.
#pragma once

#include "interaction_sample.h"

NEO_KERNELS_BEGIN

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

// One step of a tile (tile_sums): the R C sums at columns [d, d + lanes). Each step loads the
// R row operands, then either all C column operands (where the R C sums and R + C operands fit
// the register file) or one column operand at a time, used R times (AVX2's 3 x 4 tiles: 12
// sums + 3 + 1 of 16 registers).
template <class Vec, int R, int C, int STRIDE, bool DIAG, int K>
__attribute__((always_inline)) inline void tile_step(const float* const* ri, const float* const* cj, int64_t d,
                                                     typename Vec::V (&acc)[K]) {
  using V = typename Vec::V;
  V x[R], y[C];
  NEO_UNROLL
  for (int r = 0; r < R; ++r) x[r] = Vec::load(ri[r] + d);
  if constexpr (R * C + R + C > kVecRegs) {
    NEO_UNROLL
    for (int c = 0; c < C; ++c) {
      V t = Vec::load(cj[c] + d);
      keep_in_register(t);   // one load, used R times (see below)
      NEO_UNROLL
      for (int r = 0; r < R; ++r)
        if (!DIAG || c >= r) acc[r * STRIDE + c] = Vec::fmadd(x[r], t, acc[r * STRIDE + c]);
    }
    return;
  }
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

// The sums of an R x C tile over the first Dv columns (a multiple of Vec::kLanes):
// acc[r * STRIDE + c] = lane-wise partial sums of v_{i0 + r} * v_{j0 + c}; every acc entry is
// zeroed first (the ones no pair uses stay zero). DIAG: only the pairs c >= r. DV > 0: Dv is
// DV, known at compile time, and the steps are unrolled (pair_dots_d); 0: Dv at run time.
// The tile's share of the next sample's prefetches goes out as it starts (LineSpread::tile) in
// the AVX2 and AVX-512 variants; in the baseline a line at a step as the count reaches it
// (LineSpread::step): its 4-float steps without the prefetch statements between them ran up
// to 2x slower (AMD EPYC 26/2/1, rows in L1, one thread, 2026-12-03, four runs: 1.18-1.84 ->
// 2.17-3.29 us a sample at D 64, 2.18-2.92 -> 4.49-6.48 at D 128; gcc schedules the unrolled
// loads freely).
constexpr bool kSpreadPerTile = kW >= 8;
template <class Vec, int R, int C, int STRIDE, bool DIAG, int K, int DV = 0>
inline void tile_sums(const float* const* ri, const float* const* cj, int64_t Dv, typename Vec::V (&acc)[K],
                      LineSpread& next) {
  NEO_UNROLL
  for (int q = 0; q < K; ++q) acc[q] = Vec::zero();
  // Two sets of loops, not one with the step's prefetch under `if constexpr`: that one, with the
  // copy below made and left unused per tile, ran the AVX2 forward 34% slower at D 64 (371 ->
  // 497 ns a sample, rows in L1, builds alternating, 2026-12-03).
  if constexpr (!kSpreadPerTile) {   // the baseline: a count per step, on a copy kept in registers
    LineSpread spread = next;        // (through the reference gcc kept the count in memory)
    if constexpr (DV > 0) {
      NEO_UNROLL
      for (int64_t d = 0; d < DV; d += Vec::kLanes) {
        spread.step();
        tile_step<Vec, R, C, STRIDE, DIAG>(ri, cj, d, acc);
      }
    } else {
      for (int64_t d = 0; d < Dv; d += Vec::kLanes) {
        spread.step();
        tile_step<Vec, R, C, STRIDE, DIAG>(ri, cj, d, acc);
      }
    }
    next = spread;
  } else if constexpr (DV > 0) {
    next.tile(DV / Vec::kLanes);
    NEO_UNROLL
    for (int64_t d = 0; d < DV; d += Vec::kLanes) tile_step<Vec, R, C, STRIDE, DIAG>(ri, cj, d, acc);
  } else {   // the wide tiles and other D: the wide tiles unrolled ran 40% slower at D 128 (pair_dots_d)
    next.tile(Dv / Vec::kLanes);
    for (int64_t d = 0; d < Dv; d += Vec::kLanes) tile_step<Vec, R, C, STRIDE, DIAG>(ri, cj, d, acc);
  }
}

// How the 8-float tiles are compiled into their row blocks (pair_row_block): inlined, with no
// call per tile, in the AVX2 variant and for AVX-512's tall tiles; called for AVX-512's narrow
// ones and in the baseline. AMD EPYC 26/2/1, B 2048, n 27, one thread, the rows in L1, builds
// alternating (2026-12-03, three runs): the AVX2 forward inlined 513 -> 469 ns a sample at D 64,
// 893 -> 830 at D 128; AVX-512's narrow tiles inlined 5-10% slower (533 -> 563 at D 64, 929 ->
// 965 at D 128). AVX-512's tall tiles inlined on AMD EPYC 25/17/1 (Zen 4; a C++ harness over
// these headers, 2026-12-04, two runs): 2-4% faster with the rows in L2 (D 64 and 128), 1-2%
// with them in DRAM.
#if defined(__AVX2__) && !defined(__AVX512F__)
#define NEO_NARROW_TILE __attribute__((always_inline)) inline
#else
#define NEO_NARROW_TILE inline
#endif
// NEO_TALL_TILE: the tall tiles' body and the dispatch around every tile (pair_tile_any,
// pair_tile_nc), inlined in both vector variants.
#if defined(__AVX2__)
#define NEO_TALL_TILE __attribute__((always_inline)) inline
#else
#define NEO_TALL_TILE inline
#endif

// The R x C pair tile at rows i0 .. i0 + R - 1, columns j0 .. j0 + C - 1 of the upper
// triangle, over the first Dv (a multiple of kPW) of the D columns:
// out[pair (i0 + r, j0 + c)] = v_{i0 + r} . v_{j0 + c}. DIAG: the tile on the diagonal
// (j0 = i0 + 1), where only c >= r are pairs; the others are neither computed nor stored.
// `row[r] + j` is where pair (i0 + r, j) goes.
template <int R, int C, bool DIAG, int DV = 0>
NEO_TALL_TILE void pair_tile_body(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row,
                                  int64_t j0, LineSpread& next) {
  constexpr int K = (R * C + 7) / 8 * 8;   // sums reduced eight at a time; the padding stays zero
  pv acc[K];
  tile_sums<NarrowVec, R, C, C, DIAG, K, DV>(ri, cj, Dv, acc, next);
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
template <int R, int C, bool DIAG, int DV = 0>
NEO_NARROW_TILE void pair_tile(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row,
                               int64_t j0, LineSpread& next) {
  pair_tile_body<R, C, DIAG, DV>(ri, cj, Dv, row, j0, next);
}

#if defined(__AVX512F__)
// 128-bit lane r (0..3, a constant after unrolling) of v.
__attribute__((always_inline)) inline __m128 lane128(__m512 v, int r) {
  switch (r) {
    case 0: return _mm512_castps512_ps128(v);
    case 1: return _mm512_extractf32x4_ps(v, 1);
    case 2: return _mm512_extractf32x4_ps(v, 2);
    default: return _mm512_extractf32x4_ps(v, 3);
  }
}

// The floats c of q (four) with bit c of m set, to p + c: one 128-bit store where all four
// are, a masked one otherwise (masked-off floats are not accessed). The tiles' results went out
// as a 512-bit store per row under a 16-lane mask at an address shifted back 4 r floats (most
// of them across two cache lines) until 2026-12-06: on the Intel Xeon (Emerald Rapids, one
// thread, the old and new kernels alternating in one process) the grouped forward is 4-5%
// faster at D 64 with these stores (the rows in L2), the wide one at D 128 3% (in L2), 7% (a
// batch of 2048 after a 128 MiB pass) and 14-16% (a batch of 2048 from L3).
__attribute__((always_inline)) inline void store_quad(float* p, __m128 q, unsigned m) {
  if (m == 15) _mm_storeu_ps(p, q);
  else if (m) _mm_mask_storeu_ps(p, static_cast<__mmask8>(m), q);
}

// The same tile in 16-float vectors (AVX-512 variant, kFwdR = kFwdC = 4; where
// InteractionArgs::tiles is kWide): R + C loads and R * C multiply-adds of 16 floats a step,
// then the 16 sums (zero where the tile is smaller or a diagonal pair is absent) reduced by
// hsum16 into one vector, lane r * 4 + c = pair (i0 + r, j0 + c), and row r's lanes stored
// from its 128-bit lane at row[r] + j0 (store_quad). Inlined into its row block (no call per
// tile): on the Intel Xeon (Emerald Rapids, one thread, old and new alternating in one process,
// 2026-12-06) the forward 12-22% faster at D 128 and 18-27% at D 96, 192 and 256, with the rows
// in L2 and on a batch of 2048 from L3 alike.
template <int R, int C, bool DIAG>
__attribute__((always_inline)) inline void pair_tile_wide(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row,
                           int64_t j0, LineSpread& next) {
  static_assert(R <= 4 && C <= 4, "wide tiles are at most 4 x 4");
  __m512 acc[16];
  tile_sums<WideVec, R, C, 4, DIAG>(ri, cj, Dv, acc, next);
  const __m512 sums = hsum16(acc);
  NEO_UNROLL
  for (int r = 0; r < R; ++r) {
    unsigned m = 0;   // compile-time after unrolling
    for (int c = DIAG ? r : 0; c < C; ++c) m |= 1u << c;
    store_quad(row[r] + j0, lane128(sums, r), m);
  }
}
constexpr bool kHaveWideForward = true;
#else
// Declared only, for pair_tile_any's discarded branch: never instantiated without AVX-512.
template <int R, int C, bool DIAG>
void pair_tile_wide(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row, int64_t j0,
                    LineSpread& next);
constexpr bool kHaveWideForward = false;
#endif

// The tall tiles (InteractionTiles::kTall): the variants whose kTallR (simd.h) differs from kFwdR, AVX2
// (3 rows) and AVX-512 (5 rows).
constexpr bool kHaveTallForward = kTallR != kFwdR;

// Vector width of the forward's tiles: 16 floats (WIDE, AVX-512 only) or kPW.
template <bool WIDE>
constexpr int64_t fwd_width() { return WIDE ? 16 : NarrowVec::kLanes; }

template <int R, int C, bool DIAG, bool WIDE, int DV>
NEO_TALL_TILE void pair_tile_any(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row,
                                 int64_t j0, LineSpread& next) {
  if constexpr (WIDE) pair_tile_wide<R, C, DIAG>(ri, cj, Dv, row, j0, next);
  else if constexpr (kHaveTallForward && R == kTallR) pair_tile_body<R, C, DIAG, DV>(ri, cj, Dv, row, j0, next);
  else pair_tile<R, C, DIAG, DV>(ri, cj, Dv, row, j0, next);
}

// pair_tile with a compile-time column count C <= kFwdC chosen at run time (nc).
template <int R, bool DIAG, bool WIDE, int DV, int C = kFwdC>
NEO_TALL_TILE void pair_tile_nc(const float* const* ri, const float* const* cj, int64_t Dv, float* const* row,
                                int64_t j0, int64_t nc, LineSpread& next) {
  if constexpr (C > 1) {
    if (nc < C) return pair_tile_nc<R, DIAG, WIDE, DV, C - 1>(ri, cj, Dv, row, j0, nc, next);
  }
  pair_tile_any<R, C, DIAG, WIDE, DV>(ri, cj, Dv, row, j0, next);
}

// Row block [i0, i0 + R): the tile on the diagonal, whole tiles, a narrower one at the end.
template <int R, bool WIDE, int DV>
inline void pair_row_block(const float* const* v, int64_t n, int64_t Dv, int64_t i0, float* out, LineSpread& next) {
  constexpr int C = kFwdC;
  float* row[R];   // row[r][j] = pair (i0 + r, j)
  NEO_UNROLL
  for (int r = 0; r < R; ++r) row[r] = out + pair_base(i0 + r, n);
  const float* const* ri = v + i0;
  int64_t j0 = i0 + 1;
  pair_tile_nc<R, true, WIDE, DV>(ri, v + j0, Dv, row, j0, n - j0, next);   // n - j0 >= R: every row has a pair
  for (j0 += C; j0 + C <= n; j0 += C) pair_tile_any<R, C, false, WIDE, DV>(ri, v + j0, Dv, row, j0, next);
  if (j0 < n) pair_tile_nc<R, false, WIDE, DV>(ri, v + j0, Dv, row, j0, n - j0, next);
}
template <bool WIDE, int R, int DV>
inline void pair_row_block_r(const float* const* v, int64_t n, int64_t Dv, int64_t i0, int64_t nr, float* out,
                             LineSpread& next) {
  if constexpr (R > 1) {
    if (nr < R) return pair_row_block_r<WIDE, R - 1, DV>(v, n, Dv, i0, nr, out, next);
  }
  pair_row_block<R, WIDE, DV>(v, n, Dv, i0, out, next);
}

// Tile steps of pair_dots<WIDE, R> on one sample (each tile runs Dv / lanes of them): what
// LineSpread spreads the next sample's lines over.
template <bool WIDE, int R = kFwdR>
inline int64_t pair_dot_steps(int64_t n, int64_t D) {
  const int64_t Dv = D / fwd_width<WIDE>() * fwd_width<WIDE>();
  int64_t tiles = 0;
  for (int64_t i0 = 0; i0 < n - 1; i0 += R) tiles += (n - 1 - i0 + kFwdC - 1) / kFwdC;
  return tiles * (Dv / fwd_width<WIDE>());
}

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
// row n - 1 has no pair to its right), in tiles of R rows (kFwdR, or kTallR for the AVX2
// variant's tall tiles); the last D % fwd_width columns added in scalar code. The next
// sample's lines are prefetched as the tiles start (LineSpread).
template <bool WIDE, int R = kFwdR, int DV = 0>
inline void pair_dots(const float* const* v, int64_t n, int64_t D, float* out, LineSpread&& next) {
  const int64_t Dv = D / fwd_width<WIDE>() * fwd_width<WIDE>();
  for (int64_t i0 = 0; i0 < n - 1; i0 += R)
    pair_row_block_r<WIDE, R, DV>(v, n, Dv, i0, std::min<int64_t>(R, n - 1 - i0), out, next);
  next.rest();
  add_tail_dots(v, n, Dv, D, out);
}

// pair_dots on the narrow or tall tiles (kPW floats; R rows), with D 64 and 128 (the
// benchmark's widths, and common embedding widths) at compile time: each tile's loop over D
// fully unrolled, no loop count or exit per step. AMD EPYC 26/2/1, B 2048, n 27, one thread,
// a 128 MiB pass before each call, alternating in one process (2026-12-03): the AVX2 forward
// 5-10% faster at D 64 (1.67 -> 1.56 ms narrow, 1.58 -> 1.46 tall; with the data in L1 648 ->
// 586 ns a sample) and 4-8% at D 128 (2.57 -> 2.44, 2.53 -> 2.32); the AVX-512 variant's narrow
// tiles 5-16% at D 64, 5% at D 128. Not for the wide tiles: unrolled, their D 128 forward ran 40%
// slower (1.99 -> 2.77 ms; 8% faster at D 64).
template <int R>
inline void pair_dots_d(const float* const* v, int64_t n, int64_t D, float* out, LineSpread&& next) {
  if (D == 64) pair_dots<false, R, 64>(v, n, D, out, std::move(next));
  else if (D == 128) pair_dots<false, R, 128>(v, n, D, out, std::move(next));
  else pair_dots<false, R>(v, n, D, out, std::move(next));
}

NEO_KERNELS_END
