// The dot interaction's view of one sample (its n row pointers, where its pair results go)
// and the prefetches of the next sample while one computes. Shared by the forward and the
// backward (interaction.h).
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
// starts (InteractionArgs::l1_burst, Zen 4 only): its first row block reads every
// row, and there one miss after another to L2 costs more than a burst of prefetches that hit
// L2 (B 2048, D 64, AVX2 on Zen 4: forward and backward each about 5 to 8% faster). On an
// Intel Xeon (Emerald Rapids) the burst made both 5 to 8% slower at D 64 (the C++ probe of
// this header, alternating builds), and on Zen 3 (AMD EPYC 25/1/1, AVX2) forward + backward
// 7 to 9% slower at 1 and 2 threads (the burst switched per call in one process, 2026-11-30).
// Only for samples of at most kL1Burst bytes (6.9 KB at n 27, D 64): at D 128 (13.8 KB) the
// burst is no faster, or slower.
constexpr int64_t kL1Burst = 8 << 10;
inline void rows_into_l1(const InteractionArgs& a, const float* const* v, int64_t n, int64_t D) {
  if (!a.l1_burst || n * D * 4 > kL1Burst) return;
  for (int64_t r = 0; r < n; ++r) prefetch_lines_l1_kept(v[r], D * 4);
}

NEO_KERNELS_END
