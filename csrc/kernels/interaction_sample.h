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

// Whether every sample's pooled rows lie one after another (row k + 1 right after row k, as
// in a (B, F D) tensor): the same stride for every feature, offsets D apart.
inline bool pooled_rows_contiguous(const InteractionArgs& a) {
  for (int64_t k = 1; k < a.F; ++k)
    if (a.stride[k] != a.stride[0] || a.off[k] != a.off[k - 1] + a.D) return false;
  return true;
}

// Index of pair (i, j), i < j, in row-major upper-triangle order, minus j: the pair
// gradient of (i, j) is g[pair_base(i, n) + j].
inline int64_t pair_base(int64_t i, int64_t n) { return i * (n - 1) - i * (i - 1) / 2 - i - 1; }

// Lines [p, p + bytes) of the next sample into L1 (prefetcht0) or L2 (prefetcht2).
inline void prefetch_next(const void* p, int64_t bytes, bool l1) {
  if (l1) prefetch_lines_l1_kept(p, bytes);
  else prefetch_lines_l2_kept(p, bytes);
}

// The next sample's rows go into L1 (InteractionArgs::l1_next, Zen 5) only where a sample's
// rows take at most this much: two samples' rows then fit a 48 KB L1 beside the pair gradients.
constexpr int64_t kL1NextBytes = 16 << 10;

// Prefetches of the next sample into L2 while the current one computes: its n vectors and,
// in the backward, its pair gradients, spread over the current sample's work in Q shares
// (a burst of all of a sample's lines at once overflows the miss buffers: the forward at
// B 2048, D 128, AVX-512 then takes 3.7 ms instead of 2.5). Into L2, not L1: on Zen 4 and
// the Intel Xeons prefetcht0 or prefetchnta brought in the next sample over the current one
// (4.2 ms; without prefetches 4.9; the arithmetic alone about 2.0). On Zen 5 (AMD family
// 1Ah: InteractionArgs::l1_next) the rows go into L1 where two samples' rows fit
// (kL1NextBytes): AMD EPYC 26/2/1, B 2048, n 27, one thread, L1 and L2 alternating in one
// process (2026-12-03, four runs), the AVX-512 backward at D 64 1.87 -> 1.66, 2.16 -> 1.97,
// 1.49 -> 1.32, 1.52 -> 1.35 ms, at D 128 3.34 -> 2.65, 4.26 -> 3.58, 2.30 -> 2.34,
// 2.23 -> 2.19; the AVX2 backward and the forwards (LineSpread) 0-3% faster. The pair
// gradients go with them (into L1 too): the AVX-512 backward at D 128 a further 2.79 -> 2.55,
// 2.86 -> 2.59, 3.55 -> 3.24 ms, at D 64 3%; AVX2 within 3% either way. The
// prefetches are asm statements (prefetch_lines_l2_kept): gcc deleted these loops of
// __builtin_prefetch.
//
// Share q of Q is either one burst of whole rows and pair-gradient lines (part(q): the
// backward on AVX2 and the baseline, per gradient block) or, where a gradient block's steps
// are long enough to carry a prefetch each (AVX-512: 24 multiply-adds of 16 floats a step;
// AVX2's 12 of 8 slow down by a tenth), a line or a few of row j at each step j
// (row_share(q).row(j)) plus a burst of pair-gradient lines
// (grad_part(q)). Where the shares start is computed once per call (Plan): no divisions
// per sample. On Zen 5, in tools/bench_interaction.py's state (the inputs evicted by the torch
// path's pass), none of this changes the AVX2 kernels' time: without any prefetch, with
// prefetchnta, or with the backward's next rows in column order, forward and backward stayed
// within the noise (one and two threads, D 64 and 128, alternating in one process, 2026-12-03
// 11:20-11:40 UTC, docs/benchmarks.md; two to five samples ahead into L2 as well made the
// backward 5-8% slower): its hardware prefetchers carry these sequential streams. Kept for the
// other machines above. On Zen 4 (AMD EPYC 25/17/1, 2026-12-04, B 2048, n 27, one thread, after
// a torch-path pass, variants alternating in one process) they matter: the forward without them
// 24% (D 64) to 88% (D 128) slower, with every other line only (the rest left to the adjacent-line
// prefetcher) 62% slower at D 128, and the backward without them 26-55% slower; within the noise
// there: two samples ahead, the backward's next sample into L1, the backward's blocks in
// column-block order, no L1 burst; the forward's next sample into L1 made the forward faster in
// 8 of 8 pairs but the backward after it slower at D 128 (no gain end to end, four runs);
// slower: the next sample's output prefetched for writing (prefetchw, forward 8-9%). With the
// data in L2 the forward's prefetch instructions cost 7-11% of its time (fewer tests and
// branches per tile, a fixed count of lines a tile, saved nothing; a list of the next sample's
// line addresses built per sample cost what it saved; the contiguous range, LineSpread, saves
// 2-4%). Removed on 2026-12-04: the current sample's rows into L1 as it starts (the "L1 burst",
// then on Zen 4 only, measured 5-8% faster there with the AVX2 narrow tiles of 2026-11-30):
// with the tall tiles and the contiguous range it made the AVX-512 backward at D 64 2-4% slower
// in three runs of the module after a torch-path pass (2.16 -> 2.21, 2.25 -> 2.30, 2.24 ->
// 2.34 ms) and the forward 1-4%; AVX2 within 2% either way; 3-4% slower in the C++ harness.
// On Zen 3 (AMD EPYC 25/1/1, AVX2, 2026-12-07, B 2048, n 27, the module after a torch-path
// pass, variants alternating in one process, paired medians of 40): without these prefetches
// forward + backward 14-24% slower at D 64 and 35-38% at D 128 (one and two threads); the next
// sample into L1 instead of L2 0.93-1.01x the time over three runs (no clear gain, as on Zen 4);
// two or three samples ahead instead of one 0.99-1.06x (two runs). So Zen 3 keeps these defaults.
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
    l1_ = a.l1_next && n_ * row_bytes_ <= kL1NextBytes;
    if (grad_out) grad_ = reinterpret_cast<const char*>(grad_out + b * grad_floats);
  }

  // Share q at once: whole rows and pair-gradient lines.
  void part(int64_t q) const {
    if (n_ == 0) return;
    for (int64_t r = plan_.row[q]; r < plan_.row[q + 1]; ++r) prefetch_next(row_[r], row_bytes_, l1_);
    grad_part(q);
  }
  // Share q of the pair gradients.
  void grad_part(int64_t q) const {
    if (grad_)
      prefetch_next(grad_ + plan_.grad_line[q] * 64, (plan_.grad_line[q + 1] - plan_.grad_line[q]) * 64, l1_);
  }
  // Share q per step: bytes [lo, hi) of row j at step j (a line, a few, or none).
  struct RowShare {
    const float* const* rows = nullptr;
    int64_t lo = 0, hi = 0;
    bool l1 = false;
    void row(int64_t j) const {
      if (hi > lo) prefetch_next(reinterpret_cast<const char*>(rows[j]) + lo, hi - lo, l1);
    }
  };
  RowShare row_share(int64_t q) const {
    return n_ == 0 ? RowShare{} : RowShare{row_, plan_.row_byte[q], plan_.row_byte[q + 1], l1_};
  }
 private:
  friend class LineSpread;   // the forward's prefetches of the same rows, spread over its tiles
  const Plan& plan_;
  const float* row_[256];
  const char* grad_ = nullptr;
  int64_t n_ = 0, row_bytes_ = 0;   // n_ = 0: no next sample
  bool l1_ = false;                 // its rows and pair gradients into L1, not L2
};

// The forward's prefetches of the next sample (every forward: interaction_tiles.h,
// interaction_grouped.h): its lines spread evenly over the current sample's tile steps (a step
// loads one vector of each operand and issues R x C multiply-adds), one every steps / lines steps,
// the last line issued by 15/16 of the steps (kSpreadEnd); into L2 or L1 as NextSample's. The
// memory then stays busy the whole sample, where a burst per row block (NextSample::part, which the
// backward still uses) left it idle between bursts and the forward took about its arithmetic plus
// its traffic. AMD EPYC Zen 5 (26/2/1), B 2048, n 27, one thread, a 128 MiB pass before each call,
// bursts and spread alternated in one process (2026-12-03, two runs each): the forward at D 64
// 1.70-1.76 -> 1.44-1.49 ms with AVX2 and 1.91-1.99 -> 1.30-1.36 with AVX-512; at D 128 3.34-3.46
// -> 2.14-2.18 (AVX2) and 3.02-3.22 -> 2.13-2.19 (AVX-512). In the AVX2 and AVX-512 variants a tile
// issues its steps' share when it starts (tile(k): the 16.16 count advanced by k steps at once),
// not a line at a step (step(), which the baseline keeps: tile_sums): the count, its tests and its
// store stay out of the step loop (at D 64, n 27: 35 tiles of 8 steps, about 3 of the 108 lines at
// each). Same machine, alternating in one process (2026-12-03): with the rows in L1 the AVX2
// forward 536 -> 515 ns a sample at D 64, 866 -> 846 at D 128, AVX-512 558 -> 531 and 936 -> 931;
// in the module after the torch path's pass (B 2048, medians of 36) AVX2 1.42 -> 1.32 ms at D 64,
// 2.23 -> 2.18 at D 128, two threads 0.78 -> 0.73 and 1.37 -> 1.32. The same spread over the
// backward's steps (AVX2, every 4 to 8 steps) was no faster than its bursts per gradient block, or
// slower.
class LineSpread {
 public:
  static constexpr uint32_t kOne = 1u << 16;       // the increment is in lines per step, 16.16 fixed point
  static constexpr int64_t kSpreadEnd = 15;        // sixteenths of the steps by which the last line is issued

  // Increment per step for `lines` lines over `steps` steps (at most one line a step).
  static uint32_t increment(int64_t lines, int64_t steps) {
    if (steps * kSpreadEnd <= lines * 16) return kOne;
    return static_cast<uint32_t>(lines * 16 * int64_t(kOne) / (steps * kSpreadEnd));
  }

  // Where the pooled rows 1 .. n - 1 lie one after another (`contiguous`, pooled_rows_contiguous:
  // the usual (B, F D) pooled tensor), row 0's lines are issued row-wise and the rest as one
  // byte range, each line by its address alone (no row pointer, offset or end of row per
  // line): AMD EPYC 25/17/1 (Zen 4), B 2048, n 27, one thread, AVX-512, a C++ harness over
  // these headers, 2026-12-04: the forward 3-5% faster with the rows in L2, 5-8% with them in
  // DRAM (D 64 and 128); in the module after a torch-path pass 3-5%.
  LineSpread(const NextSample& next, uint32_t inc, bool contiguous)
      : rows_(next.row_), n_(next.n_), row_bytes_(next.row_bytes_), inc_(inc), l1_(next.l1_) {
    if (!contiguous || n_ < 3) return;   // n_ = 0: no next sample
    const auto first = reinterpret_cast<uintptr_t>(rows_[1]);
    cur_ = reinterpret_cast<const char*>(first & ~uintptr_t(63));   // its first line
    end_ = reinterpret_cast<const char*>(first) + (n_ - 1) * row_bytes_;
    n_ = 1;
  }

  // One tile step: a prefetch where the count has reached a whole line (the baseline variant).
  __attribute__((always_inline)) inline void step() {   // inlined: a call would spill the tile's sums
    acc_ += inc_;
    if (acc_ < kOne) return;
    acc_ -= kOne;
    if (r_ < n_) {
      issue_line();
    } else if (cur_ < end_) {
      prefetch_next(cur_, 64, l1_);
      cur_ += 64;
    }
  }
  // A tile of k steps starts: the lines its steps' share has reached, one prefetch each.
  __attribute__((always_inline)) inline void tile(int64_t k) {
    uint64_t count = acc_ + static_cast<uint64_t>(inc_) * static_cast<uint64_t>(k);
    for (; count >= kOne && r_ < n_; count -= kOne) issue_line();
    if (count >= kOne && cur_ < end_) {
      const int64_t lines = std::min<int64_t>(static_cast<int64_t>(count >> 16), (end_ - cur_ + 63) / 64);
      if (l1_) block_lines<3>(lines);
      else block_lines<1>(lines);
      count -= static_cast<uint64_t>(lines) << 16;
    }
    acc_ = static_cast<uint32_t>(std::min<uint64_t>(count, kOne));   // at most kOne: every line issued
  }
  // The lines the steps left (more lines than steps; D below the vector width).
  void rest() {
    for (; r_ < n_; ++r_, off_ = 0)
      prefetch_next(reinterpret_cast<const char*>(rows_[r_]) + off_, row_bytes_ - off_, l1_);
    if (cur_ < end_) prefetch_next(cur_, end_ - cur_, l1_);
    cur_ = end_;
  }

 private:
  // The next line of the rows (r_ < n_), and the cursor past it.
  __attribute__((always_inline)) inline void issue_line() {
    prefetch_next(reinterpret_cast<const char*>(rows_[r_]) + off_, 64, l1_);
    off_ += 64;
    if (off_ >= row_bytes_) {
      off_ = 0;
      ++r_;
    }
  }
  // The next `lines` lines of the byte range [cur_, end_), into L1 (3) or L2 (1).
  template <int Locality>
  __attribute__((always_inline)) inline void block_lines(int64_t lines) {
    const char* c = cur_;
    for (int64_t q = 0; q < lines; ++q) prefetch_lines_kept<Locality>(c + 64 * q, 64);
    cur_ = c + 64 * lines;
  }

  const float* const* rows_;
  int64_t n_, row_bytes_, r_ = 0, off_ = 0;   // rows [r_, n_) row by row
  const char *cur_ = nullptr, *end_ = nullptr;  // then the byte range [cur_, end_), cur_ on a line
  uint32_t inc_, acc_ = 0;
  bool l1_;
};

NEO_KERNELS_END
