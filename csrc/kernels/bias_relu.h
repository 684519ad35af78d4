// An MLP layer's bias and ReLU around its GEMM (neo.models.mlp: Linear followed by ReLU).
//
//     forward:   y = relu(x W^T + b), the product from at::mm, then bias_relu() in place on it
//     backward:  gp = g where y > 0, else 0;  grad b = column sums of gp   (one pass: relu_bias_backward)
//
// torch runs these as addmm (the bias first copied into the output, which the GEMM then reads
// and adds to), clamp_min (a new tensor), threshold_backward (a new tensor) and sum(0) (a read
// of it): two more passes over a (B, N) activation per layer and direction. Here each
// direction makes one pass, while the product is still in cache.
//
// Semantics as torch's: relu(v) = 0 where v <= 0, v otherwise (NaN stays NaN); the mask of
// the backward is threshold_backward's (y <= 0 -> 0), so a NaN activation passes its gradient.
// The bias gradient is summed in fixed blocks of kBiasReluBlock rows in fp32, and the blocks'
// sums added in fp64 in block order: the same bits at any thread count.
#pragma once

#include "../kernel_types.h"
#include "util.h"

NEO_KERNELS_BEGIN

inline float relu_of(float v) { return v <= 0.0f ? 0.0f : v; }

// y (rows, N) = relu(y + b), in place.
void bias_relu(float* y, const float* b, int64_t rows, int64_t N) {
  at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, N)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* yr = y + r * N;
      for (int64_t j = 0; j < N; ++j) yr[j] = relu_of(yr[j] + b[j]);
    }
  });
}

// gp (rows, N) = g masked by y > 0; gb (N,) = the column sums of gp. partial: scratch of
// ceil(rows / kBiasReluBlock) * N floats (one row of sums per block).
void relu_bias_backward(const float* g, const float* y, float* gp, float* gb, float* partial, int64_t rows,
                        int64_t N) {
  const int64_t blocks = (rows + kBiasReluBlock - 1) / kBiasReluBlock;
  at::parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float* s = partial + k * N;
      for (int64_t j = 0; j < N; ++j) s[j] = 0.0f;
      for (int64_t r = k * kBiasReluBlock, r1 = std::min(rows, r + kBiasReluBlock); r < r1; ++r) {
        const float* gr = g + r * N;
        const float* yr = y + r * N;
        float* pr = gp + r * N;
        for (int64_t j = 0; j < N; ++j) {
          const float v = yr[j] <= 0.0f ? 0.0f : gr[j];
          pr[j] = v;
          s[j] += v;
        }
      }
    }
  });
  std::vector<double> t(N, 0.0);
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t j = 0; j < N; ++j) t[j] += partial[k * N + j];
  for (int64_t j = 0; j < N; ++j) gb[j] = static_cast<float>(t[j]);
}

NEO_KERNELS_END
