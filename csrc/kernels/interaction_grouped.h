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
// there: five runs between 8% less and 7% more). D 32 to 80: 7 to 24% less than the better of the 8- and 16-float tiles; at D 128
// no faster than the 16-float tiles (the transposes weigh as much as the reductions saved).

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
  static_assert(kFwdR == 4, "the prefetch shares (pair_row_blocks) are one per group of 4 rows");
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
// Never called without AVX-512 (InteractionArgs::tiles is never kGrouped there): a stand-in.
inline void grouped_dots(const float* const* v, int64_t n, int64_t D, float* out, NextSample&& next, float* T) {}
constexpr bool kHaveGroupedForward = false;
#endif

NEO_KERNELS_END
