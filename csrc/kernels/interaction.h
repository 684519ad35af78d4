// DLRM's dot interaction, fused (one ISA variant): forward and backward of
//
//     v = [dense, pooled_1 .. pooled_F]            (B, n, D), n = F + 1
//     out = [dense, (v_i . v_j for i < j)]         (B, D + P), P = n (n - 1) / 2, pairs in
//                                                  row-major upper-triangle order
//
// without materializing v, the (B, n, n) Gram matrix or the concatenations. Samples are
// processed one at a time (their n vectors, 6.9 KB at n 27, D 64, stay in L1) and split over
// the torch threads.
//
// Arithmetic per sample: the forward is P dots of D floats (P D fused multiply-adds), the
// backward grad v_i = sum_{j != i} S[i][j] v_j with S the symmetric pair gradients (2 P D:
// the symmetric product, each multiply-add needed once). Both kernels issue exactly these
// and no more (no diagonal, no padding pairs). At n 27: 22.5 k + 44.9 k FMAs per sample at
// D 64. One Zen 4 core does 16 fp32 FMAs a cycle with AVX2 or with AVX-512 (512-bit
// operations take both 256-bit pipes; 57 G/s measured at 3.6 GHz), so the floor at B 2048
// is 0.8 + 1.6 ms at D 64 and 1.6 + 3.2 ms at D 128. Bytes: the forward reads n D and writes
// D + P floats a sample, the backward reads n D + D + P and writes n D: 17 + 31 MB at B 2048,
// D 64, which one core streams from DRAM in 0.6 + 1.1 ms (27 GB/s read, 29 read and
// streaming writes) if the kernels overlap the memory traffic with the arithmetic
// (NextSample) instead of following it. Measured with the data in L2: the forward at 66% of
// the FMA peak at D 64 (short dot products: the tiles' reductions and stores weigh) and 80%
// at D 128 on AVX-512, the backward at 90% (AVX2: 66/72% and 78%). On the Intel Xeon of
// 2026-11-29 (family 6 model 167; tools/bench_interaction.py --bounds): forward + backward at
// 49-50% of its AVX-512 FMA peak with the data in L2, 71-75% with AVX2, and only 2-11% slower
// on a batch the last-level cache still holds. In tools/bench_interaction.py (where the
// inputs come partly from the last-level cache, partly from DRAM) forward + backward take
// 1.4-1.6x the time of their reads and writes alone, timed beside them (the traffic probe,
// probe.h: the forward 1.6-1.9x its traffic, where its arithmetic alone is 1.5x it at D 64;
// the backward 1.3-1.4x), a floor 5.3-5.8x below the torch path under AVX-512. Per phase
// (AVX-512, in L2): the forward at 38-40% (its one full 8 x 8 grouped tile at 78% alone; the
// triangle's diagonal and end tiles and the row interleaves take the rest), the backward at
// 63-66% (68% in a C++ harness on 64-byte aligned rows, 57% on rows off a cache line).
//
// Forward: pair dots in tiles of kFwdR rows x kFwdC columns of the upper triangle (2 x 4 on
// AVX2 and the baseline, 4 x 4 on AVX-512: the sums plus one 8-float vector of each operand
// row fit the register file). The AVX2 variant also has tiles of kTallR = 3 rows x 4 where
// InteractionArgs::tiles is kTall (on AMD Zen 3, 4 and 5, cpu_isa.h): 12 sums, the 3 row operands, and the
// column operands loaded one at a time (tile_sums); 35 tiles a sample at n 27 instead of 49,
// and fewer short ones at the triangle's edge (whose few sums leave the FMA pipes idle
// waiting on their latency). The AVX-512 variant's tall tiles are 5 x 4 of 8-float vectors
// (on Zen 4: 20 sums and all 9 operands in 32 registers; 23 tiles a sample instead of 28).
// On AVX-512 the tiles take 16-float vectors instead where
// InteractionArgs::tiles is kWide (D >= 96 on CPUs with two 512-bit FMA pipes, cpu_isa.h):
// half the multiply-adds, and one 16-way reduction tree (hsum16) per tile (Intel Xeon,
// B 2048, D 128: forward 10% faster with the batch in DRAM, 20% in cache; no faster at D 64,
// where the reductions weigh as much as the multiply-adds). A row block [i0, i0 + R) starts
// with the tile on the diagonal (columns i0 + 1 ..), of which only the pairs c >= r exist:
// the others are masked at compile time (no multiply-add, nothing stored); then whole
// tiles, and a narrower one at the row's end (the column count a template argument too):
// exactly P dots. Each step along D loads R + C vectors and issues R * C fused
// multiply-adds; a tile's sums are reduced horizontally eight at a time (a transposing tree
// of hadds) and stored row by row (a row's C results are contiguous in the output). At D 64
// and 128 the narrow and tall tiles take D as a compile-time constant, their steps unrolled
// (pair_dots_d, interaction_tiles.h: 5-10% faster at D 64 on Zen 5). On
// AVX-512 from D 16 to 95 (InteractionArgs::tiles kGrouped) the grouped forward runs instead:
// rows interleaved four at a time, 4-way reductions (its section below).
//
// Backward: grad v_i = sum_j S[i][j] v_j in blocks of kBwdR rows x kBwdC vectors of D (6 x 2
// on AVX2: 12 sums + 2 operands + 1 broadcast; 6 x 4 on AVX-512), each j a broadcast of
// S[i][j] times the vectors of v_j. S is not built: the weights are read in place from the
// pair gradients (upper-triangle order), in three runs of j per block: j < i0 (S[i][j] =
// g(j, i), contiguous in i), the block's own rows (unrolled; the zero diagonal skipped), and
// j >= i0 + R (S[i][j] = g(i, j), one pointer per row). Rows are split into blocks of nearly
// equal size (27 = 6 + 6 + 5 + 5 + 5: no short block with too few sums to hide the FMA
// latency). The result is written straight into the (B, D) dense gradient (plus the dense
// part of grad_out passed through) and the pooled gradient (times grad_scale; streaming
// stores when it is large, see kStreamBytes).
//
// Memory: at B 2048 the inputs (13.6 MB at n 27, D 64) come from DRAM; the next sample's
// rows (and pair gradients) are prefetched into L2 (L1 on Zen 5) while the current one
// computes: in the forwards a few lines as each tile starts (LineSpread), in the backward in
// shares (NextSample).
//
// Not done: a forward with one sample in each vector lane (the inputs transposed kW x kW, no
// horizontal sums). Built and measured on the Intel Xeon (docs/benchmarks.md, 2026-11-28
// 12:20 UTC): 1.3x (AVX-512) to 2x (AVX2) slower than these tiles. Under AVX2 the tiles
// already issue the minimum of 8-float multiply-adds (their reductions use port 5, beside the
// FMA ports); under AVX-512 the transposes' 512-bit shuffles take the ports the multiply-adds
// need (at best a fifth faster than the 16-float tiles, in theory).
// Not done either: AMX tiles (Intel Sapphire Rapids and later) with fp32 accuracy from bf16
// ("bf16x3": each float split exactly into three bf16 parts, six of the nine part products
// summed by TDPBF16PS). Prototyped on the Intel Xeon with AMX (family 6 model 167,
// 2026-11-29; a C++ harness over these headers, one thread, B 2048): D 64 forward 2.70 ms
// and backward 3.42 ms against these tiles' 1.09 and 1.66 (D 128: 4.51 / 7.20 against 2.21
// / 3.42), accurate (max error against float64 2.9e-6 to 7.1e-6, these tiles' 3.0e-6 to
// 1.1e-5). The tile products are cheap (36 TDPBF16PS a sample at D 64, 440 reference cycles
// alone); the conversions are not: splitting a sample's rows into parts alone took 940
// reference cycles, the 32-bit transposes the B operand needs 520, together more than this
// whole forward (about 1,170), and the splits ran slower still beside the tile loads.
//
// Not done either: AVX-512's grouped forward ported to AVX2 (two rows interleaved by 4-float
// chunks in each 8-float vector, 4-way reductions): in a C++ harness on Zen 4 (docs/benchmarks.md,
// 2026-12-04 19:01 UTC section) at most 2% faster than the tall tiles at D 64 with the rows in
// L2, 14-18% slower at D 128.
//
// Not done either: n at compile time (every j of the backward's blocks unrolled, the weights'
// offsets constants; the forward's row blocks and end tiles fixed), for DLRM's n 27. On Zen 4
// (docs/benchmarks.md, the 2026-12-04 23:25 UTC section) the AVX2 backward 3-5% faster in the C++
// harness, but no faster in the module after a torch-path pass (within 1%, two A/Bs); AVX-512's
// within 1.5%; the forward 3-14% slower.
//
// FMA is used (vfmadd); the result differs from torch's bmm path by summation order and
// rounding only (tested against the formula in float64). D not a multiple of kW: the last
// D % kW columns are summed in scalar code.
//
// Files: interaction_sample.h (a sample's rows, the next sample's prefetches),
// interaction_tiles.h (the 8- and 16-float forward tiles), interaction_grouped.h (the grouped
// forward), interaction_backward.h; the forward's entry point here.
#pragma once

#include "interaction_backward.h"
#include "interaction_grouped.h"
#include "interaction_tiles.h"

NEO_KERNELS_BEGIN

void interaction_forward(const InteractionArgs& a, float* out) {
  const int64_t D = a.D, n = a.F + 1, P = n * (n - 1) / 2;
  const bool grouped = kHaveGroupedForward && a.tiles == InteractionTiles::kGrouped;
  const bool wide = kHaveWideForward && a.tiles == InteractionTiles::kWide;
  const bool tall = kHaveTallForward && a.tiles == InteractionTiles::kTall;
  const NextSample::Plan plan(n, D, 0, 0);   // no shares: every forward spreads its prefetches (LineSpread)
  // The prefetches, spread over the tiles' steps.
  const int64_t steps = grouped ? grouped_steps(n, D)
                        : wide ? pair_dot_steps<kHaveWideForward>(n, D)
                        : tall ? pair_dot_steps<false, kTallR>(n, D) : pair_dot_steps<false>(n, D);
  const uint32_t spread = LineSpread::increment(n * ((D * 4 + 63) / 64), steps);
  const bool contiguous = pooled_rows_contiguous(a);
  at::parallel_for(0, a.B, 64, [&](int64_t b0, int64_t b1) {
    const float* v[256];
    // The grouped forward's interleaved rows: 8 Dv floats, 64-byte aligned.
    std::unique_ptr<float[]> T_owner(grouped ? new float[8 * D + 16] : nullptr);
    float* T = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(T_owner.get()) + 63) & ~uintptr_t(63));
    for (int64_t b = b0; b < b1; ++b) {
      sample_rows(a, b, v);
      float* o = out + b * (D + P);
      std::memcpy(o, v[0], D * sizeof(float));
      NextSample next(a, b + 1, b1, nullptr, 0, plan);
      if (grouped) grouped_dots(v, n, D, o + D, LineSpread(next, spread, contiguous), T);
      else if (wide) pair_dots<kHaveWideForward>(v, n, D, o + D, LineSpread(next, spread, contiguous));
      else if (tall) pair_dots_d<kTallR>(v, n, D, o + D, LineSpread(next, spread, contiguous));
      else pair_dots_d<kFwdR>(v, n, D, o + D, LineSpread(next, spread, contiguous));
    }
  });
}

NEO_KERNELS_END
