// Row-wise application of the fused sparse optimizers (OptParams: kernel_types.h), in fp32,
// in exactly the operation order of neo.embedding.backends.reference.apply_optimizer (each
// torch op rounds to fp32 once; no FMA contraction: the kernels are compiled with
// -ffp-contract=off), so fp16/bf16 weights match the reference bit for bit. Exceptions
// (reductions, whose order inside torch is its own): rowwise_adagrad's mean(g*g) and LAMB's
// row norms may differ from torch in the last fp32 bit. The loops have compile-time
// lengths for the common D and vectorize with the variant's instructions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "round16.h"
#include "stochastic_rounding.h"
#include "util.h"

NEO_KERNELS_BEGIN

// Sum of squares with 16 independent lanes, then a tree over the lanes (short dependency
// chain: this sits on every row's critical path). The order is fixed, so results depend
// neither on threads nor on the ISA: lanes 0-7 and 8-15 are two 8-float GCC vectors (a ymm
// each, or two xmm), and the tree is the same pairwise sums as lane[l] += lane[l + w] for
// w = 8, 4, 2, 1, done on vector halves (a scalar tree on the stack cost ~60 cycles a row in
// row-wise Adagrad). Not one 16-float vector: on AVX2 gcc 12 split that into halves through
// general registers and the stack, and the 32-byte reload of two 16-byte stores stalled
// store forwarding (perf: 18% of the fused row update's samples, B 4096 x 8 tables, D 64).
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
// The end of sum_squares' tree: lanes 0-7 summed as lane[l] += lane[l + w] for w = 4, 2, 1.
inline float sum_lanes8(const f32x8& s) {
  f32x4 lo4, hi4;
  std::memcpy(&lo4, &s, sizeof(lo4));
  std::memcpy(&hi4, reinterpret_cast<const char*>(&s) + sizeof(lo4), sizeof(hi4));
  const f32x4 b = lo4 + hi4;   // w = 4
  return (b[0] + b[2]) + (b[1] + b[3]);   // w = 2, 1
}

inline float sum_squares(const float* x, int64_t n) {
  f32x8 lo = {}, hi = {};   // lanes 0-7, 8-15
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    f32x8 a, b;
    std::memcpy(&a, x + i, sizeof(a));
    std::memcpy(&b, x + i + 8, sizeof(b));
    lo += a * a;
    hi += b * b;
  }
  if (i < n) {   // the last n - i (< 16) values into the first lanes; the others add +0 to a sum >= +0
    float t[16] = {0};
    std::memcpy(t, x + i, (n - i) * sizeof(float));
    f32x8 a, b;
    std::memcpy(&a, t, sizeof(a));
    std::memcpy(&b, t + 8, sizeof(b));
    lo += a * a;
    hi += b * b;
  }
  return sum_lanes8(lo + hi);   // w = 8, then the rest of the tree
}

// Write fp32 row `wf` back to storage: as is (fp32), nearest even, or stochastically with
// uniforms keyed by the flat element index elem0 + d.
inline void store_row(float* w, const float* wf, int64_t D, bool, uint64_t, int64_t) {
  for (int64_t d = 0; d < D; ++d) w[d] = wf[d];
}
template <typename T>
inline void store_row(T* w, const float* wf, int64_t D, bool stochastic, uint64_t key, int64_t elem0) {
  store_row16(w, wf, D, stochastic, key, elem0);   // round16.h: eight at a time where the ISA allows
}

// Tests (KernelTable::round_rows_*): n rows through store_row, row i at elements elem0 + i D.
template <typename T>
void round_rows(const float* x, T* out, int64_t n, int64_t D, bool stochastic, uint64_t key, int64_t elem0) {
  for (int64_t i = 0; i < n; ++i) store_row(out + i * D, x + i * D, D, stochastic, key, elem0 + i * D);
}

// One optimizer step on one row.
//   w: the row in storage; g: its summed gradient (fp32, D; used as scratch);
//   s0/s1: state (per element: D values each; rowwise: one value at s0[0]);
//   wf: scratch of D floats.
// DC: the row length when known at compile time (straight-line vector code), else 0.
template <int64_t DC, typename T>
inline void update_row(const OptParams& o, T* w, float* g, float* s0, float* s1, float* wf, int64_t D_,
                       bool stochastic, uint64_t key, int64_t elem0) {
  const int64_t D = DC ? DC : D_;
  load_f32(w, wf, D);
  if (o.has_wd && o.kind != kLamb)
    for (int64_t d = 0; d < D; ++d) g[d] = g[d] + o.wd * wf[d];
  switch (o.kind) {
    case kSGD:
      for (int64_t d = 0; d < D; ++d) wf[d] = wf[d] - o.lr * g[d];
      break;
    case kAdagrad:
      for (int64_t d = 0; d < D; ++d) {
        const float s = s0[d] + g[d] * g[d];
        s0[d] = s;
        wf[d] = wf[d] - (o.lr * g[d]) / (std::sqrt(s) + o.eps);
      }
      break;
    case kRowwiseAdagrad: {
      const float mean = sum_squares(g, D) / static_cast<float>(D);
      const float s = s0[0] + mean;
      s0[0] = s;
      const float scale = (1.0f / (std::sqrt(s) + o.eps)) * o.lr;   // torch: lr / x == x.reciprocal() * lr
      for (int64_t d = 0; d < D; ++d) wf[d] = wf[d] - scale * g[d];
      break;
    }
    case kAdam:
    case kLamb: {
      for (int64_t d = 0; d < D; ++d) {
        const float m = o.b1 * s0[d] + o.one_minus_b1 * g[d];
        const float v = o.b2 * s1[d] + (o.one_minus_b2 * g[d]) * g[d];
        s0[d] = m;
        s1[d] = v;
        g[d] = (m / o.bias1) / (std::sqrt(v / o.bias2) + o.eps);   // u, kept in g
      }
      if (o.kind == kAdam) {
        for (int64_t d = 0; d < D; ++d) wf[d] = wf[d] - o.lr * g[d];
      } else {
        for (int64_t d = 0; d < D; ++d) g[d] = g[d] + o.wd * wf[d];     // decoupled decay
        const float wn = std::sqrt(sum_squares(wf, D));
        const float un = std::sqrt(sum_squares(g, D));
        const float ratio = (wn > 0.0f && un > 0.0f) ? wn / un : 1.0f;
        const float step = o.lr * ratio;
        for (int64_t d = 0; d < D; ++d) wf[d] = wf[d] - step * g[d];
      }
      break;
    }
    default:
      break;
  }
  store_row(w, wf, D, stochastic, key, elem0);
}

NEO_KERNELS_END
