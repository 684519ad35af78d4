// Row-wise application of the fused sparse optimizers, in fp32, in exactly the operation
// order of neo.embedding.backends.reference.apply_optimizer (each torch op rounds to fp32
// once; no FMA contraction here: the including file is compiled with fp-contract=off), so
// fp16/bf16 weights match the reference bit for bit. Exceptions (reductions, whose order
// inside torch is its own): rowwise_adagrad's mean(g*g) and LAMB's row norms may differ
// from torch in the last fp32 bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.h"
#include "stochastic_rounding.h"

namespace neo {

enum OptKind : int64_t { kSGD = 0, kAdagrad = 1, kRowwiseAdagrad = 2, kAdam = 3, kLamb = 4 };

struct OptParams {
  int64_t kind = kSGD;
  float lr = 0, eps = 0, wd = 0, b1 = 0, b2 = 0;
  float one_minus_b1 = 0, one_minus_b2 = 0;   // (1 - b1) in double, then fp32 (as torch casts the scalar)
  float bias1 = 1, bias2 = 1;                 // 1 - b^step in double, then fp32
  bool has_wd = false;
};

inline OptParams make_opt_params(int64_t kind, double lr, double eps, double wd, double b1, double b2, int64_t step) {
  OptParams o;
  o.kind = kind;
  o.lr = static_cast<float>(lr);
  o.eps = static_cast<float>(eps);
  o.wd = static_cast<float>(wd);
  o.has_wd = wd != 0.0;
  o.b1 = static_cast<float>(b1);
  o.b2 = static_cast<float>(b2);
  o.one_minus_b1 = static_cast<float>(1.0 - b1);
  o.one_minus_b2 = static_cast<float>(1.0 - b2);
  o.bias1 = static_cast<float>(1.0 - std::pow(b1, static_cast<double>(step)));
  o.bias2 = static_cast<float>(1.0 - std::pow(b2, static_cast<double>(step)));
  return o;
}

// Sum of squares with 16 independent lanes, then a tree over the lanes (short dependency
// chain: this sits on every row's critical path). The order is fixed, so results do not
// depend on threads.
inline float sum_squares(const float* x, int64_t n) {
  float lane[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lane[l] += x[i + l] * x[i + l];
  const int64_t rem = n - i;  // < 16
  for (int64_t l = 0; l < rem; ++l) lane[l] += x[i + l] * x[i + l];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

// Write fp32 row `wf` back to storage: as is (fp32), nearest even, or stochastically with
// uniforms keyed by the flat element index elem0 + d.
inline void store_row(float* w, const float* wf, int64_t D, bool, uint64_t, int64_t) {
  for (int64_t d = 0; d < D; ++d) w[d] = wf[d];
}
template <typename T>
inline void store_row(T* w, const float* wf, int64_t D, bool stochastic, uint64_t key, int64_t elem0) {
  if (stochastic) {
    for (int64_t d = 0; d < D; ++d)
      w[d] = round_stochastic<T>(wf[d], sr_uniform(key, static_cast<uint64_t>(elem0 + d)));
  } else {
    for (int64_t d = 0; d < D; ++d) w[d] = T(wf[d]);
  }
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

}  // namespace neo
