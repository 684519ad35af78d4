// The dot interaction backward: S v in register blocks, written straight into the dense and
// pooled gradients (interaction.h describes it).
#pragma once

#include "interaction_sample.h"

NEO_KERNELS_BEGIN

// The backward's prefetch per step (NextSample): where a gradient block step has at least
// 256 floats of multiply-adds.
constexpr bool kPrefetchPerStep = kBwdR * kBwdC * kW >= 256;

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
// them for all the compiler knows): backward 3-4% faster at D 64 and 128 on AVX2. SCALED:
// go.scale is not 1 (a sharded output's gradient scale); where it is 1 (every plain tensor)
// the block's rows are stored as summed, not multiplied by 1 first (the same floats): one
// multiply in every 27 dropped from the FMA pipes, the AVX2 backward 2-4% faster (AMD EPYC
// 26/2/1, B 2048, n 27, one thread, alternating in one process, 2026-12-03: 2.12 -> 2.04 ms at D 64,
// 4.08 -> 3.99 at D 128).
template <int R, int C, bool STREAM, bool FIRST, bool SCALED>
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
      const vf y = dense ? vadd(vload(go.add0 + d0 + c * kW), acc[r][c]) : SCALED ? vmul(acc[r][c], scale) : acc[r][c];
      if (STREAM && !dense) vstream(out[r] + c * kW, y);
      else vstore(out[r] + c * kW, y);
    }
  }
}

// grad_block with STREAM, FIRST and SCALED from run-time facts.
template <int R, int C, bool SCALED>
inline void grad_block_s(const float* const* v, int64_t n, const float* g, int64_t i0, int64_t d0, const GradOut& go,
                         const NextSample::RowShare& next) {
  if (i0 == 0) {
    if (go.stream) grad_block<R, C, true, true, SCALED>(v, n, g, i0, d0, go, next);
    else grad_block<R, C, false, true, SCALED>(v, n, g, i0, d0, go, next);
  } else {
    if (go.stream) grad_block<R, C, true, false, SCALED>(v, n, g, i0, d0, go, next);
    else grad_block<R, C, false, false, SCALED>(v, n, g, i0, d0, go, next);
  }
}

// Compile-time C for the columns' remainder, then R.
template <int R, int C = kBwdC>
inline void grad_block_c(const float* const* v, int64_t n, const float* g, int64_t i0, int64_t d0, int64_t nc,
                         const GradOut& go, const NextSample::RowShare& next) {
  if constexpr (C > 1) {
    if (nc < C) return grad_block_c<R, C - 1>(v, n, g, i0, d0, nc, go, next);
  }
  if (go.scale != 1.0f) grad_block_s<R, C, true>(v, n, g, i0, d0, go, next);
  else grad_block_s<R, C, false>(v, n, g, i0, d0, go, next);
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
// cache's working set (backward at B 2048: 5% faster at D 64, 25% at D 128; on Zen 4, AMD EPYC
// 25/17/1, 2026-12-04, AVX2, one thread: 31% less time at D 64, 37% at D 128). Blocks of 4 x 3
// (AVX2) or 4 x 4 (AVX-512) instead of 6 x 2 and 6 x 4 were 2-8% slower there with the data in L2.
constexpr int64_t kStreamBytes = int64_t(4) << 20;
// Whether the pooled gradient is large enough (and its rows whole vectors) to stream; each
// row's alignment is tested where it is written.
inline bool large_pooled_gradient(const InteractionArgs& a) {
  return a.B * a.F * a.D * 4 >= kStreamBytes && a.D % kW == 0;
}

void interaction_backward(const InteractionArgs& a, const float* grad_out, float* grad_dense, float* grad_pooled,
                          float scale) {
  const int64_t D = a.D, n = a.F + 1, P = n * (n - 1) / 2;
  const NextSample::Plan plan(n, D, D + P, grad_blocks(n, D));   // a share per gradient block
  const bool large = large_pooled_gradient(a);
  at::parallel_for(0, a.B, 64, [&](int64_t b0, int64_t b1) {
    const float* v[256];
    float* outs[256];
    std::vector<float> S(D % kW ? n * n : 0);
    for (int64_t b = b0; b < b1; ++b) {
      sample_rows(a, b, v);
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
