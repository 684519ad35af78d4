// The dot interaction forward in interleaved row groups ("grouped"; AVX-512 only).
#pragma once

#include "interaction_tiles.h"

NEO_KERNELS_BEGIN

#if defined(__AVX512F__)
// The grouped forward (InteractionArgs::tiles kGrouped; AVX-512, D < 96 on Intel:
// cpu_isa.h). Rows are taken four at a time and interleaved by 4-float chunks: T[a] = [r0 chunk a, r1 chunk a,
// r2 chunk a, r3 chunk a], one 16-float vector (a 4 x 4 transpose of 128-bit blocks per 16
// columns, 8 shuffles, once per group of rows). A column row's chunk a is broadcast to the
// four 128-bit lanes (a load, no shuffle), so one multiply-add advances the dots of four
// pairs (the group's rows against one column) by four columns each, and a tile's sums need
// only a 4-way reduction within 128-bit lanes (sum_quads: 6 shuffles and 3 adds for 16 pairs,
// where hsum16 takes 30 and 15). Two groups (8 rows) share each column's broadcasts: 2 + C
// loads and 2 C multiply-adds a step for C columns. Against the 8-float tiles at D 64 on the
// Intel Xeon (Emerald Rapids), one thread (docs/benchmarks.md, 2026-11-28 21:10 UTC): a
// sample's arithmetic (in L1) 24% less time, a batch of 2048 in L2 16% less; with the batch
// in L3 or DRAM, as in tools/bench_interaction.py, the same within noise (bound by memory
// there: five runs between 8% less and 7% more). D 32 to 80: 7 to 24% less than the better of
// the 8- and 16-float tiles; at D 128 no faster than the 16-float tiles while both stored their
// results as 512-bit masked stores, 10-12% less time (rows in L2) since the 128-bit stores
// (store_quad, 2026-12-06; cpu_isa.h has the measurements up to D 256), and level again (within
// 2% at D 96, 2-5% behind at D 128) once the wide tiles were inlined as well.
//
// Where a sample's time goes (the same Xeon, D 64, rows in L2, 2026-12-06, parts removed in
// turn from a copy of these kernels): the tiles about 70%, the next sample's prefetches (then
// in bursts per row block, NextSample::part) 8%, the interleaving 7%, the rest (row pointers,
// the dense copy, the blocks' set-up) 13%. The big tiles (2 groups x 8 columns) run at 88% of
// the FMA peak alone; the diagonal's and the row ends' narrower ones, with fewer sums, less
// (hence their second set of sums). The next sample's lines are now spread over the tiles'
// steps (LineSpread, as in the 8- and 16-float forwards): in the C++ harness, on a batch of 2048
// from L3, 4-5% faster than the bursts with the core to itself and 1-4% slower with a busy
// neighbour (the VM's two speeds; 4% slower with the rows in L2, where no prefetch is needed);
// in tools/bench_interaction.py --all-variants (after the torch path's pass) the grouped
// forward took 0.866-0.876 of the narrow tiles' time with the bursts (two runs) and
// 0.824-0.860 with the spread (two runs).

// T[a] for a < Dv / 4 from rows r[0..3] (Dv a multiple of 16; T 64-byte aligned).
inline void interleave_rows4(const float* const* r, int64_t Dv, float* T) {
  for (int64_t d = 0; d < Dv; d += 16) {
    const __m512 x0 = _mm512_loadu_ps(r[0] + d), x1 = _mm512_loadu_ps(r[1] + d);
    const __m512 x2 = _mm512_loadu_ps(r[2] + d), x3 = _mm512_loadu_ps(r[3] + d);
    // t0 = [x0 c0, x0 c1, x1 c0, x1 c1], t1 = the same of c2 c3; t2, t3 of x2 and x3
    const __m512 t0 = _mm512_shuffle_f32x4(x0, x1, 0x44), t1 = _mm512_shuffle_f32x4(x0, x1, 0xEE);
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
  // s01, per 128-bit lane: [a0 0+2, a1 0+2, a0 1+3, a1 1+3]; s23 the same of a2 and a3
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512d x = _mm512_castps_pd(s01), y = _mm512_castps_pd(s23);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}

// G interleaved groups (T[g]) x columns cj[0..C) starting at column j0: pair (row r of group
// g, column j0 + c) goes to rows[g][r] + j0 + c. The last group may be partial (R rows) and,
// where DIAG, sits on the diagonal (its row r pairs only with columns c >= r).
// Inlined into its row block (no call per tile): Intel Xeon (Emerald Rapids), one thread, the
// old and new kernels alternating in one process (2026-12-06): the forward 2-9% faster at D 64
// with the rows in L2 and 1-8% on a batch of 2048 from L3, 1-3% at D 32, 48 and 80.
template <int G, int R, int C, bool DIAG>
__attribute__((always_inline)) inline void group_tile(const float* const* T, const float* const* cj, int64_t Dv,
                                                      float* (*rows)[4], int64_t j0, LineSpread& next) {
  next.tile(Dv / 4);   // this tile's share of the next sample's prefetches
  constexpr int Q = (C + 3) / 4;   // column quads; a partial quad's missing sums stay zero
  __m512 acc[G][Q * 4];
  NEO_UNROLL
  for (int g = 0; g < G; ++g)
    NEO_UNROLL
    for (int c = 0; c < Q * 4; ++c) acc[g][c] = _mm512_setzero_ps();
  // Fewer than 8 sums (the tiles on the diagonal and at a row's end): a second set of sums for
  // the odd steps (Dv / 4 is even), so that consecutive multiply-adds into one sum do not wait on
  // each other's latency (4 cycles, 2 pipes: 8 sums keep both busy); added at the end. Intel Xeon
  // (Emerald Rapids), D 64, the rows in L2, alternating in one process (2026-12-06): the forward
  // 2-3% faster.
  constexpr int S = G * C < 8 ? 2 : 1;
  __m512 acc2[G][Q * 4];
  NEO_UNROLL
  for (int g = 0; g < G; ++g)
    NEO_UNROLL
    for (int c = 0; c < Q * 4; ++c) acc2[g][c] = _mm512_setzero_ps();
  for (int64_t a = 0, A = Dv / 4; a < A; a += S) {
    NEO_UNROLL
    for (int s = 0; s < S; ++s) {
      __m512 x[G];
      NEO_UNROLL
      for (int g = 0; g < G; ++g) x[g] = _mm512_load_ps(T[g] + (a + s) * 16);
      NEO_UNROLL
      for (int c = 0; c < C; ++c) {
        const __m512 y = _mm512_broadcast_f32x4(_mm_loadu_ps(cj[c] + 4 * (a + s)));
        NEO_UNROLL
        for (int g = 0; g < G; ++g) {
          __m512& sum = s == 0 ? acc[g][c] : acc2[g][c];
          sum = _mm512_fmadd_ps(x[g], y, sum);
        }
      }
    }
  }
  if constexpr (S == 2) {
    NEO_UNROLL
    for (int g = 0; g < G; ++g)
      NEO_UNROLL
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_add_ps(acc[g][c], acc2[g][c]);
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
          if (4 * q + c < C && !(DIAG && last && 4 * q + c < r)) m |= 1u << c;
        store_quad(rows[g][r] + j0 + 4 * q, lane128(s, r), m);   // lanes 4 r .. 4 r + 3
      }
    }
  }
}

// group_tile with a compile-time column count C <= 8 chosen at run time (nc).
template <int G, int R, bool DIAG, int C = 8>
inline void group_tile_nc(const float* const* T, const float* const* cj, int64_t Dv, float* (*rows)[4],
                          int64_t j0, int64_t nc, LineSpread& next) {
  if constexpr (C > 1) {
    if (nc < C) return group_tile_nc<G, R, DIAG, C - 1>(T, cj, Dv, rows, j0, nc, next);
  }
  group_tile<G, R, C, DIAG>(T, cj, Dv, rows, j0, next);
}

// Rows [i0, i0 + 4 G) (the last group has R rows with pairs; the others 4): interleaved into
// T (4 Dv floats a group), then the tiles of their columns i0 + 1 .. n - 1.
template <int G, int R>
inline void group_block(const float* const* v, int64_t n, int64_t Dv, int64_t i0, float* out, float* T,
                        LineSpread& next) {
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
    group_tile<1, 4, 4, true>(Tg, v + j0, Dv, rows, j0, next);
    j0 += 4;
  }
  group_tile_nc<G, R, true>(Tg, v + j0, Dv, rows, j0, n - j0, next);   // on the last group's diagonal
  for (j0 += 8; j0 + 8 <= n; j0 += 8) group_tile<G, R, 8, false>(Tg, v + j0, Dv, rows, j0, next);
  if (j0 < n) group_tile_nc<G, R, false>(Tg, v + j0, Dv, rows, j0, n - j0, next);
}

// Tiles a sample's grouped forward runs (group_block's, block by block, as grouped_dots takes
// them) times the steps of each (Dv / 4): what LineSpread spreads the next sample's lines over.
inline int64_t grouped_steps(int64_t n, int64_t D) {
  const int64_t Dv = D / 16 * 16;
  int64_t tiles = 0;
  for (int64_t i0 = 0; i0 < n - 1;) {
    const bool two = n - 1 - i0 >= 8;
    int64_t j0 = i0 + 1 + (two ? 4 : 0);
    tiles += two ? 2 : 1;                              // the diagonal tile(s)
    for (j0 += 8; j0 < n; j0 += 8) ++tiles;           // whole tiles, then a narrower one
    i0 += two ? 8 : 4;
  }
  return tiles * (Dv / 4);
}

// out[p] = v_i . v_j over pairs i < j as pair_dots does, in blocks of 8 rows (then 4 or fewer);
// T: 8 Dv floats of 64-byte aligned scratch.
inline void grouped_dots(const float* const* v, int64_t n, int64_t D, float* out, LineSpread&& next,
                         float* T) {
  const int64_t Dv = D / 16 * 16;
  for (int64_t i0 = 0; i0 < n - 1;) {
    const int64_t left = n - 1 - i0;
    if (left >= 8) {
      group_block<2, 4>(v, n, Dv, i0, out, T, next);
      i0 += 8;
      continue;
    }
    switch (std::min<int64_t>(left, 4)) {
      case 4: group_block<1, 4>(v, n, Dv, i0, out, T, next); break;
      case 3: group_block<1, 3>(v, n, Dv, i0, out, T, next); break;
      case 2: group_block<1, 2>(v, n, Dv, i0, out, T, next); break;
      default: group_block<1, 1>(v, n, Dv, i0, out, T, next); break;
    }
    i0 += 4;
  }
  next.rest();
  add_tail_dots(v, n, Dv, D, out);
}
constexpr bool kHaveGroupedForward = true;
#else
// Never called without AVX-512 (InteractionArgs::tiles is never kGrouped there): a stand-in.
inline void grouped_dots(const float* const* v, int64_t n, int64_t D, float* out, LineSpread&& next,
                         float* T) {}
inline int64_t grouped_steps(int64_t n, int64_t D) { return 0; }
constexpr bool kHaveGroupedForward = false;
#endif

NEO_KERNELS_END
