// DLRM's dot interaction, fused (one ISA variant): forward and backward of
//
//     v = [dense, pooled_1 .. pooled_F]            (B, n, D), n = F + 1
//     out = [dense, (v_i . v_j for i < j)]         (B, D + P), P = n (n - 1) / 2, pairs in
//                                                  row-major upper-triangle order
//
// without materializing v, the (B, n, n) Gram matrix or the concatenations. Per sample the
// n vectors (6.9 KB at n 27, D 64) stay in L1; samples are split over the torch threads.
//
// Forward: the pair dots are computed in tiles of kFwdR rows x kFwdC columns of the upper
// triangle (2 x 4 on AVX2 and the baseline, 4 x 4 on AVX-512, with 8-float vectors and
// 32 registers: the sums plus one vector of each operand row fit the register file). Each
// step loads kFwdR + kFwdC vectors along D and issues kFwdR * kFwdC fused multiply-adds; at
// the end the tile's sums are reduced horizontally eight at a time (a transposing tree of
// hadds) and stored, a row's kFwdC results at once. Tiles on the diagonal compute a few
// pairs they do not store (12% extra at n 27), instead of transposing v to vectorize along j.
//
// Backward: S (n, n) symmetric with S[i][j] = S[j][i] = the gradient of pair (i, j), zero
// diagonal; grad v_i = sum_j S[i][j] v_j, in blocks of kBwdR rows x kBwdC vectors of D
// (6 x 2 on AVX2: 12 sums + 2 operands + 1 broadcast; 6 x 4 on AVX-512), each j a
// broadcast of S[i][j] times the vectors of v_j. The result is written straight into the
// (B, D) dense gradient (plus the dense part of grad_out passed through) and the pooled
// gradient (times grad_scale; streaming stores when it is large, see kStreamBytes).
//
// Memory: at B 2048 the inputs (13.6 MB at n 27, D 64) come from DRAM; the next sample's
// rows are prefetched into L2 while the current one computes (NextSample).
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

// Prefetches of the next sample, spread over the current one's row blocks: `parts` calls
// part(0 .. parts - 1) together bring its vectors (and, in the backward, its pair gradients
// and its output rows, with write intent) into L2. A sample's rows are read in a strided
// order the hardware prefetchers do not follow across samples; one burst of all its lines
// at once would overflow the miss buffers, so each row block issues its share. Into L2,
// not L1: L2 keeps more misses in flight (backward, B 2048, D 64, AVX2: 4.2 ms with L2
// prefetches of the next sample, 6.5 with L1 prefetches, 5.4 without).
struct NextSample {
  const float* in[256];
  float* out[256];            // null: none (forward)
  const float* grad = nullptr;
  int64_t n = 0, row_bytes = 0, grad_bytes = 0;

  NextSample(const InteractionArgs& a, int64_t b, int64_t b1, float* grad_pooled, const float* grad_out,
             int64_t grad_floats) {
    if (b >= b1) return;   // n = 0: nothing to prefetch
    n = a.F + 1;
    row_bytes = a.D * 4;
    sample_rows(a, b, in);
    out[0] = nullptr;
    for (int64_t k = 0; k < a.F; ++k) out[k + 1] = grad_pooled ? grad_pooled + a.off[k] + b * a.stride[k] : nullptr;
    if (grad_out) {
      grad = grad_out + b * grad_floats;
      grad_bytes = grad_floats * 4;
    }
  }
  void part(int64_t k, int64_t parts) const {
    for (int64_t r = n * k / parts; r < n * (k + 1) / parts; ++r) {
      prefetch_row_l2(in[r], row_bytes);
      if (out[r]) prefetch_row_w_l2(out[r], row_bytes);
    }
    if (grad) {
      const int64_t lo = grad_bytes * k / parts / 64 * 64, hi = grad_bytes * (k + 1) / parts;
      prefetch_row_l2(reinterpret_cast<const char*>(grad) + lo, hi - lo);
    }
  }
};

// Dot products of R rows with C columns over D floats: res[r * C + c] = ri[r] . cj[c]
// (R * C a multiple of 8: the sums are reduced eight at a time).
template <int R, int C>
inline void dot_tile(const float* const* ri, const float* const* cj, int64_t D, float* res) {
  static_assert((R * C) % 8 == 0, "pair tiles reduce eight sums at a time");
  pv acc[R * C];
  for (int q = 0; q < R * C; ++q) acc[q] = pzero();
  const int64_t Dv = D / kPW * kPW;
  for (int64_t d = 0; d < Dv; d += kPW) {
    pv x[R], y[C];
    for (int r = 0; r < R; ++r) x[r] = pload(ri[r] + d);
    for (int c = 0; c < C; ++c) {
      y[c] = pload(cj[c] + d);
      keep_in_register(y[c]);   // else gcc folds the load into each of the R multiply-adds: R times the loads
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r * C + c] = pfmadd(x[r], y[c], acc[r * C + c]);
  }
  for (int q = 0; q < R * C; q += 8) hsum8(acc + q, res + q);
  for (int64_t d = Dv; d < D; ++d)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) res[r * C + c] += ri[r][d] * cj[c][d];
}

// out[p] = v_i . v_j over pairs i < j, p in row-major upper-triangle order. Tiles of R rows
// x C columns start at j = i0 + 1; a tile wholly above the diagonal and inside the matrix
// stores each row's C results at once (contiguous in the output), the others pair by pair.
inline void pair_dots(const float* const* v, int64_t n, int64_t D, float* out, const NextSample& next) {
  constexpr int R = kFwdR, C = kFwdC;
  const int64_t blocks = (n - 1 + R - 1) / R;
  for (int64_t i0 = 0; i0 < n - 1; i0 += R) {
    next.part(i0 / R, blocks);
    const float* ri[R];
    for (int r = 0; r < R; ++r) ri[r] = v[std::min<int64_t>(i0 + r, n - 1)];   // past the end: computed, not stored
    float* row[R];                                                            // row[r][j] = pair (i0 + r, j)
    for (int r = 0; r < R; ++r) {
      const int64_t i = i0 + r;
      row[r] = out + i * (n - 1) - i * (i - 1) / 2 - i - 1;
    }
    for (int64_t j0 = i0 + 1; j0 < n; j0 += C) {
      const float* cj[C];
      for (int c = 0; c < C; ++c) cj[c] = v[std::min<int64_t>(j0 + c, n - 1)];
      float res[R * C];
      dot_tile<R, C>(ri, cj, D, res);
      if (j0 >= i0 + R && j0 + C <= n && i0 + R <= n - 1) {
        for (int r = 0; r < R; ++r) std::memcpy(row[r] + j0, res + r * C, C * sizeof(float));
        continue;
      }
      for (int r = 0; r < R && i0 + r < n - 1; ++r) {   // row r keeps columns j0 + c with i0 + r < j0 + c < n
        const int64_t c_hi = std::min<int64_t>(C, n - j0);
        for (int64_t c = std::max<int64_t>(0, i0 + r + 1 - j0); c < c_hi; ++c) row[r][j0 + c] = res[r * C + c];
      }
    }
  }
}

void interaction_forward(const InteractionArgs& a, float* out) {
  const int64_t D = a.D, n = a.F + 1, P = n * (n - 1) / 2;
  at::parallel_for(0, a.B, 64, [&](int64_t b0, int64_t b1) {
    const float* v[256];
    for (int64_t b = b0; b < b1; ++b) {
      sample_rows(a, b, v);
      float* o = out + b * (D + P);
      std::memcpy(o, v[0], D * sizeof(float));
      pair_dots(v, n, D, o + D, NextSample(a, b + 1, b1, nullptr, nullptr, 0));
    }
  });
}

// Where block rows go: row 0 (dense) = add0 + sum; rows k >= 1 = sum * scale.
struct GradOut {
  float* const* out;
  const float* add0;
  float scale;
  bool stream;
};

// Rows [i0, i0 + R) x columns [d0, d0 + C * kW) of S v.
template <int R, int C, bool STREAM>
inline void grad_block(const float* const* v, int64_t n, const float* S, int64_t i0, int64_t d0, const GradOut& g) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  for (int64_t j = 0; j < n; ++j) {
    vf x[C];
    for (int c = 0; c < C; ++c) x[c] = vload(v[j] + d0 + c * kW);
    const float* s = S + i0 * n + j;
    for (int r = 0; r < R; ++r) {
      const vf w = vset1(s[r * n]);
      for (int c = 0; c < C; ++c) acc[r][c] = vfmadd(w, x[c], acc[r][c]);
    }
  }
  const vf scale = vset1(g.scale);
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + r;
    for (int c = 0; c < C; ++c) {
      const int64_t d = d0 + c * kW;
      const vf x = i == 0 ? vadd(vload(g.add0 + d), acc[r][c]) : vmul(acc[r][c], scale);
      if (STREAM && i != 0) vstream(g.out[i] + d, x);
      else vstore(g.out[i] + d, x);
    }
  }
}

// Compile-time C for the columns' remainder, then R.
template <int R, int C = kBwdC>
inline void grad_block_c(const float* const* v, int64_t n, const float* S, int64_t i0, int64_t d0, int nc,
                         const GradOut& g) {
  if constexpr (C <= 1) {
    if (g.stream) grad_block<R, 1, true>(v, n, S, i0, d0, g);
    else grad_block<R, 1, false>(v, n, S, i0, d0, g);
  } else {
    if (nc < C) grad_block_c<R, C - 1>(v, n, S, i0, d0, nc, g);
    else if (g.stream) grad_block<R, C, true>(v, n, S, i0, d0, g);
    else grad_block<R, C, false>(v, n, S, i0, d0, g);
  }
}
template <int R = kBwdR>
inline void grad_block_rc(const float* const* v, int64_t n, const float* S, int64_t i0, int64_t d0, int nr, int nc,
                          const GradOut& g) {
  if constexpr (R <= 1) {
    grad_block_c<1>(v, n, S, i0, d0, nc, g);
  } else {
    if (nr >= R) grad_block_c<R>(v, n, S, i0, d0, nc, g);
    else grad_block_rc<R - 1>(v, n, S, i0, d0, nr, nc, g);
  }
}

// grad v_i = sum_j S[i][j] v_j for every i, written as GradOut says.
inline void grad_rows(const float* const* v, int64_t n, int64_t D, const float* S, const GradOut& g,
                      const NextSample& next) {
  const int64_t Dv = D / kW * kW;
  const int64_t blocks = (n + kBwdR - 1) / kBwdR;
  for (int64_t i0 = 0; i0 < n; i0 += kBwdR) {
    next.part(i0 / kBwdR, blocks);
    const int nr = static_cast<int>(std::min<int64_t>(kBwdR, n - i0));
    for (int64_t d0 = 0; d0 < Dv; d0 += kBwdC * kW) {
      const int nc = static_cast<int>(std::min<int64_t>(kBwdC, (Dv - d0) / kW));
      grad_block_rc(v, n, S, i0, d0, nr, nc, g);
    }
  }
  for (int64_t i = 0; i < n; ++i)   // the last D % kW columns
    for (int64_t d = Dv; d < D; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) acc += S[i * n + j] * v[j][d];
      g.out[i][d] = i == 0 ? g.add0[d] + acc : acc * g.scale;
    }
}

// S (n, n), symmetric, zero diagonal, from the pair gradients gp (row-major upper
// triangle): row segments copied, then the lower triangle transposed from the upper.
inline void pair_matrix(const float* gp, int64_t n, float* S) {
  for (int64_t i = 0; i < n; ++i) {
    S[i * n + i] = 0.0f;
    std::memcpy(S + i * n + i + 1, gp, (n - 1 - i) * sizeof(float));
    gp += n - 1 - i;
  }
  for (int64_t i = 1; i < n; ++i)
    for (int64_t j = 0; j < i; ++j) S[i * n + j] = S[j * n + i];
}

// The pooled gradient is written with non-temporal (streaming) stores when it is large
// (at least kStreamBytes) and its rows are aligned to the vector width: no read for
// ownership of lines about to be overwritten, and megabytes of gradient do not evict the
// cache's working set (backward at B 2048, D 64: about 10% faster).
constexpr int64_t kStreamBytes = int64_t(4) << 20;

void interaction_backward(const InteractionArgs& a, const float* grad_out, float* grad_dense, float* grad_pooled,
                          float scale) {
  const int64_t D = a.D, n = a.F + 1, P = n * (n - 1) / 2;
  const bool large = a.B * a.F * D * 4 >= kStreamBytes && D % kW == 0;
  at::parallel_for(0, a.B, 64, [&](int64_t b0, int64_t b1) {
    std::vector<float> S(n * n);
    const float* v[256];
    float* outs[256];
    for (int64_t b = b0; b < b1; ++b) {
      sample_rows(a, b, v);
      const float* g = grad_out + b * (D + P);
      pair_matrix(g + D, n, S.data());
      outs[0] = grad_dense + b * D;
      for (int64_t k = 0; k < a.F; ++k) outs[k + 1] = grad_pooled + a.off[k] + b * a.stride[k];
      bool stream = large;
      for (int64_t k = 1; k <= a.F && stream; ++k) stream = reinterpret_cast<uintptr_t>(outs[k]) % (kW * 4) == 0;
      grad_rows(v, n, D, S.data(), GradOut{outs, g, scale, stream},
                NextSample(a, b + 1, b1, grad_pooled, grad_out, D + P));
    }
    vsfence();
  });
}

NEO_KERNELS_END
