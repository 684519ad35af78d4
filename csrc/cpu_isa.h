// Per-ISA builds of the hot kernels with runtime dispatch.
//
// Every hot kernel (pooled lookup, fused backward + optimizer, the per-id weights' gradient,
// dot interaction, bucketization, the gather probe) lives in csrc/kernels/ and is compiled once per ISA
// variant by a wrapper in csrc/isa/ (kernels_<isa>.cpp: `#define NEO_ISA <isa>`, then the
// kernel headers), with that variant's flags (setup.py):
//
//   baseline   the compiler's default target (x86-64: SSE2; aarch64: NEON)
//   avx2       -mavx2 -mfma -mf16c                                   (x86-64 only)
//   avx512     avx2's plus -mavx512f -mavx512bw -mavx512vl -mavx512dq (x86-64 only)
//
// Each variant's code sits in its own namespace (neo::baseline, neo::avx2, neo::avx512) and
// exports one KernelTable of function pointers. The entry points (embedding_forward.cpp,
// ...; compiled for the baseline) validate their tensors and call the active table.
// At import the best variant the CPU supports is chosen (cpuid + xgetbv), unless
// NEO_CPU_ISA=baseline|avx2|avx512 asks for another one; asking for one the CPU lacks,
// or one not built, is an error that says what the CPU offers.
//
// Portability: no translation unit but the variants is compiled with more than the
// baseline's instructions, and the variants' objects are linked after every baseline
// object, so where a variant emits an inline function of a shared header (std::, c10::)
// out of line the linker keeps the baseline copy (the first definition of a COMDAT
// group wins). tests/embedding/test_cpu_isa_selection.py checks the built library: no AVX
// instruction outside neo::avx2 / neo::avx512, no AVX-512 register outside neo::avx512.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_types.h"

namespace neo {

struct KernelTable {
  const char* isa;  // "baseline", "avx2", "avx512"

  // Pooled forward of a group: writes (B, total_dim) fp32; returns the invalid id count.
  int64_t (*forward_f32)(const GroupMeta&, const float* W, const Lookup&, float* out);
  int64_t (*forward_f16)(const GroupMeta&, const c10::Half* W, const Lookup&, float* out);
  int64_t (*forward_bf16)(const GroupMeta&, const c10::BFloat16* W, const Lookup&, float* out);

  // Fused backward + optimizer step in place; returns the invalid id count.
  int64_t (*backward_f32)(const GroupMeta&, float* W, const Lookup&, const UpdateArgs&);
  int64_t (*backward_f16)(const GroupMeta&, c10::Half* W, const Lookup&, const UpdateArgs&);
  int64_t (*backward_bf16)(const GroupMeta&, c10::BFloat16* W, const Lookup&, const UpdateArgs&);

  // DLRM dot interaction: out (B, D + P); backward writes grad_dense (B, D) and
  // grad_pooled (the pooled layout, times scale).
  void (*interaction_forward)(const InteractionArgs&, float* out);
  void (*interaction_backward)(const InteractionArgs&, const float* grad_out, float* grad_dense,
                               float* grad_pooled, float scale);

  // An MLP layer's bias + ReLU in place on y (rows, N), and its backward: gp = g masked by
  // y > 0, gb = column sums of gp (partial: ceil(rows / kBiasReluBlock) * N floats of scratch).
  void (*bias_relu)(float* y, const float* b, int64_t rows, int64_t N);
  void (*relu_bias_backward)(const float* g, const float* y, float* gp, float* gb, float* partial, int64_t rows,
                             int64_t N);

  // Row-range bucketization of one feature's ids.
  void (*bucketize_i32)(const BucketizeArgs<int32_t>&);
  void (*bucketize_i64)(const BucketizeArgs<int64_t>&);

  // Range check of a batch's ids: per-feature counts of ids outside their table, optionally
  // the ids narrowed to int32.
  void (*id_check_i32)(const IdCheckArgs<int32_t>&);
  void (*id_check_i64)(const IdCheckArgs<int64_t>&);

  // Memory probe: sums rows ids[0..n) of `row_bytes` bytes each of table (`rows` rows; as
  // integers), prefetching `prefetch` ids ahead into L1 and `far` ids ahead with locality hint
  // `far_hint` (every `far_every`-th line; 0 ids: none), on the torch threads; returns a
  // checksum, and in *invalid the ids outside [0, rows) (not read).
  uint64_t (*gather_probe)(const uint8_t* table, int64_t row_bytes, int64_t rows, const int64_t* ids, int64_t n,
                           int64_t prefetch, int64_t far, int64_t far_hint, int64_t far_every, int64_t* invalid);
  // Memory probe: the dot interaction's reads and writes alone (interaction_forward's and
  // interaction_backward's, same arguments), no arithmetic; the outputs hold no meaning.
  void (*interaction_traffic_forward)(const InteractionArgs&, float* out);
  void (*interaction_traffic_backward)(const InteractionArgs&, const float* grad_out, float* grad_dense,
                                       float* grad_pooled, float scale);

  // Tests: rows x (n, D) fp32 written to 16-bit storage as the optimizers write updated
  // rows (store_row: nearest even, or stochastically with element indices elem0 + i D + d).
  void (*round_rows_f16)(const float* x, c10::Half* out, int64_t n, int64_t D, bool stochastic, uint64_t key,
                         int64_t elem0);
  void (*round_rows_bf16)(const float* x, c10::BFloat16* out, int64_t n, int64_t D, bool stochastic,
                          uint64_t key, int64_t elem0);

  // Gradient of the pooled lookup with respect to its per-id weights: out (N,) fp32, from
  // grad (B, total_dim) fp32; 0 for an invalid id.
  void (*weight_grad_f32)(const GroupMeta&, const float* W, const Lookup&, const float* grad, float* out);
  void (*weight_grad_f16)(const GroupMeta&, const c10::Half* W, const Lookup&, const float* grad, float* out);
  void (*weight_grad_bf16)(const GroupMeta&, const c10::BFloat16* W, const Lookup&, const float* grad, float* out);
};

// The variants' tables (defined in csrc/isa/kernels_<isa>.cpp; only those built exist).
namespace baseline { const KernelTable& kernel_table(); }
namespace avx2 { const KernelTable& kernel_table(); }
namespace avx512 { const KernelTable& kernel_table(); }

// The active variant's kernels (chosen at import; see init_cpu_isa).
const KernelTable& kernels();

// Chooses the variant: NEO_CPU_ISA if set, else the best the CPU supports. Throws
// std::runtime_error with a readable message if NEO_CPU_ISA names an unknown, unbuilt or
// unsupported variant.
void init_cpu_isa();

std::string cpu_isa();                              // the active variant
std::vector<std::string> cpu_isa_variants();        // built, lowest first
std::vector<std::string> cpu_isa_supported();       // built and runnable on this CPU
std::vector<std::pair<std::string, bool>> cpu_features();   // detected CPU features (x86: cpuid/xgetbv)
void set_cpu_isa(const std::string& name);          // switch (tests, benchmarks); throws like init_cpu_isa

// Tuning of the dot interaction (csrc/kernels/interaction.h) per microarchitecture, from what
// was measured on the four this project has run on (docs/benchmarks.md): AMD Zen 4 (family
// 19h, whose 512-bit operations take both 256-bit pipes), AMD Zen 3 (family 19h, AVX2 only),
// AMD Zen 5 (family 1Ah) and Intel's AVX-512 server cores (two 512-bit FMA pipes).
//   tiles      the AVX-512 forward's pair tiles: "narrow" (8-float vectors, as every variant),
//              "wide" (16-float vectors, D >= kWideMinDim) or "grouped" (rows interleaved in
//              groups of four, D >= kGroupedMinDim). "auto": on AMD (families 19h and 1Ah)
//              narrow; on Intel wide from kWideMinDim and grouped below it (Intel, D 128: wide
//              forward 10-20% faster than narrow; D 32 to 80: grouped 7-24% less time than
//              either, with the batch in cache. Since the 128-bit result stores of 2026-12-06, on
//              the Intel Xeon Emerald Rapids GenuineIntel 6/207/2, one thread: grouped 10-12% less
//              time than wide at D 96 and 128 with the rows in L2 (a C++ harness over these
//              kernels, the two alternating), but in tools/bench_interaction.py --all-variants,
//              after the torch path's pass, wide's D 128 forward 2-13% faster than grouped's in
//              five runs (2.21-2.68 ms against 2.46-2.90); with the wide tiles inlined too
//              (6bd1991) the harness put wide within 2% of grouped at D 96 and 2-5% ahead at D 128:
//              wide stays from D 96 on. On Zen 4 no
//              FMA gain from 16-float vectors, costlier reductions; on Zen 5, AMD EPYC 26/2/1,
//              2026-12-02, the narrow forward took 15-23% less time than wide at D 128 in five
//              runs, and within 12% of grouped either way at D 64). They differ in rounding only
//              (summation order). The AVX2 forward's tiles: "narrow" (2 x 4 pairs) or "tall"
//              (3 x 4: 35 tiles a sample at n 27 instead of 49, fewer of them narrow at the
//              triangle's edge; each column operand loaded once and used three times, 16
//              registers). "auto": tall on AMD: Zen 3
//              (family 19h without AVX-512; forward 7-10% faster at D 64 and 128, one thread,
//              AMD EPYC 25/1/1, 2026-11-30), Zen 5 (family 1Ah; forward 1-14% faster than narrow
//              at D 64 and 128, one and two threads, in three runs of
//              tools/bench_interaction.py --isa avx2 --all-variants, AMD EPYC 26/2/1, 2026-12-03)
//              and Zen 4 (family 19h with AVX-512, AMD EPYC 25/17/1, 2026-12-04, two runs: forward
//              7-14% faster at D 128 and 1-3% at D 64 at one thread, -12% to +1% at two; forward +
//              backward paired 4.55-4.99x torch's against narrow's 4.43-4.71x in 6 of 8 pairs; the
//              3 x 4 tile of 2026-11-24 had been 5-15% slower there), narrow on Intel (within
//              noise). Same sums, same order: bit-identical results. The AVX-512 kernels'
//              "tall" tiles: 5 x 4 pairs of 8-float vectors (23 tiles a sample at n 27 instead
//              of narrow's 28; 20 sums and 9 operands of the 32 registers); "auto": on Zen 4
//              (family 19h with AVX-512, AMD EPYC 25/17/1, 2026-12-04, B 2048, n 27: beside
//              narrow in four runs of tools/bench_interaction.py --all-variants, 1 and 2 threads,
//              the forward faster in 10 of 16 cells, every D 64 one-thread one, slower in 3;
//              with the data in L2 5% faster at D 64, within 1% at D 128), narrow elsewhere
//              (Zen 5 not measured; Intel: wide/grouped).
//              NEO_INTERACTION_TILES=auto|narrow|wide|grouped|tall sets it at import.
//   L1 next    the next sample's rows prefetched into L1 (prefetcht0) instead of L2 while the
//              current one computes, where two samples' rows fit L1: on Zen 5 only (AMD family
//              1Ah, 48 KB L1: the AVX-512 backward up to 20% faster, AMD EPYC 26/2/1, 2026-12-03;
//              csrc/kernels/interaction_sample.h). Not measured elsewhere: Zen 3's L1 is 32 KB,
//              and into L1 was slower on Zen 4 and the Intel Xeons (in bursts). No effect on results.
constexpr int64_t kWideMinDim = 96;
constexpr int64_t kGroupedMinDim = 16;               // below: no whole 16-column block to interleave
bool amd_family_19h();                               // this CPU is AMD family 19h (Zen 3, Zen 4)
bool amd_family_1ah();                               // this CPU is AMD family 1Ah (Zen 5)
bool amd_zen3();                                     // AMD family 19h without AVX-512 (Zen 3; Zen 4 has it)
bool intel_cpu();                                    // this CPU is an Intel one (GenuineIntel)
bool interaction_l1_next();                          // the next sample into L1: this CPU is Zen 5 (above)
void set_interaction_tiles(const std::string& name); // "auto", "narrow", "wide", "grouped", "tall"; throws otherwise
std::string interaction_tiles();                     // the setting
InteractionTiles interaction_tiles_at(int64_t D);    // what the active variant's forward runs at D
std::string interaction_forward_tiles(int64_t D);    // its name: "narrow", "wide", "grouped" or "tall"
bool interaction_wide(int64_t D);                    // interaction_tiles_at(D) == kWide

}  // namespace neo
