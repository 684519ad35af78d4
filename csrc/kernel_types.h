// Plain data shared by the dispatching entry points (compiled once, for the baseline ISA)
// and the kernels (compiled once per ISA, csrc/isa/): no ATen tensors, no inline code
// with external linkage beyond trivial accessors, so nothing here can be emitted with one
// variant's instructions and picked up by another (see csrc/cpu_isa.h).
#pragma once

#include <cstdint>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace neo {

// Static metadata of one embedding group (see neo/embedding/layout.py), read once per call
// from the layout's int64 tensors (T tables, F features; all tiny).
struct GroupMeta {
  int64_t T = 0, F = 0, B = 0, total_dim = 0, total_rows = 0;
  const int64_t* rows = nullptr;       // (T,)
  const int64_t* dims = nullptr;       // (T,)
  const int64_t* woff = nullptr;       // (T,) weight_offsets
  const int64_t* roff = nullptr;       // (T,) row_offsets
  const int64_t* ftable = nullptr;     // (F,) feature -> table
  const int64_t* outoff = nullptr;     // (F + 1,) output column offsets
  const int64_t* fmean = nullptr;      // (F,) 1 = mean pooling
  int64_t max_dim = 0;
};

// The ids of one call: bags of feature f are [f * B, (f + 1) * B) in offsets.
struct Lookup {
  const int64_t* idx = nullptr;        // (N,) ids
  const int64_t* off = nullptr;        // (F * B + 1,) bag offsets into idx
  const float* psw = nullptr;          // (N,) per-id weights, or null
};

enum OptKind : int64_t { kSGD = 0, kAdagrad = 1, kRowwiseAdagrad = 2, kAdam = 3, kLamb = 4 };

// Optimizer hyper-parameters as the kernels use them (fp32, derived once per call).
struct OptParams {
  int64_t kind = kSGD;
  float lr = 0, eps = 0, wd = 0, b1 = 0, b2 = 0;
  float one_minus_b1 = 0, one_minus_b2 = 0;   // (1 - b1) in double, then fp32 (as torch casts the scalar)
  float bias1 = 1, bias2 = 1;                 // 1 - b^step in double, then fp32
  bool has_wd = false;
};

// Everything the fused backward + update needs besides the weights.
struct UpdateArgs {
  float* s0 = nullptr;                 // first optimizer state (per element, or per row if rowwise)
  float* s1 = nullptr;                 // second state (Adam, LAMB)
  bool rowwise_state = false;
  const float* grad = nullptr;         // (B, total_dim) gradient of the pooled output
  OptParams opt;
  bool stochastic = false;             // stochastic rounding of fp16/bf16 weights
  uint64_t sr_key = 0;                 // keyed by (seed, step)
};

// The n = F + 1 vectors of the dot interaction: sample b's dense vector is dense + b * D,
// its feature k starts at pooled + off[k] + b * stride[k].
// The dot interaction forward's tiling (cpu_isa.h): 8-float tiles (every variant), 16-float
// tiles or interleaved row groups (AVX-512 only), or 8-float tiles of kTallR rows (AVX2 only).
enum class InteractionTiles : int8_t { kNarrow, kWide, kGrouped, kTall };

struct InteractionArgs {
  int64_t B = 0, D = 0, F = 0;
  const float* dense = nullptr;
  const float* pooled = nullptr;
  const int64_t* off = nullptr;        // (F,)
  const int64_t* stride = nullptr;     // (F,)
  InteractionTiles tiles = InteractionTiles::kNarrow;   // the forward's (cpu_isa.h)
  bool l1_next = false;                // the next sample's rows prefetched into L1, not L2 (cpu_isa.h)
};

// Rows per block of relu_bias_backward's bias-gradient sums (kernels/bias_relu.h): its scratch
// holds ceil(rows / kBiasReluBlock) rows of N floats.
constexpr int64_t kBiasReluBlock = 64;

// Row-range bucketization of one feature (see bucketize.h for the meaning of the outputs).
template <typename T>
struct BucketizeArgs {
  const T* values = nullptr;
  const int64_t* off = nullptr;        // (B + 1,)
  int64_t B = 0;
  const int64_t* bounds = nullptr;     // (S + 1,)
  int64_t S = 0;
  int64_t* lens = nullptr;             // (S, B), zeroed by the caller
  T* out = nullptr;                    // (N,)
  int64_t* sizes = nullptr;            // (S,)
  int64_t* pos = nullptr;              // (N,) or null
};

// Range check of a batch's ids (see id_check.h).
template <typename T>
struct IdCheckArgs {
  const T* values = nullptr;           // (N,)
  const int64_t* starts = nullptr;     // (F + 1,): each feature's first id, then N; starts[0] = 0
  const int64_t* rows = nullptr;       // (F,): rows of the table each feature reads
  int64_t F = 0;
  int64_t* counts = nullptr;           // (F,) out, zeroed by the caller: ids outside [0, rows[f])
  int32_t* out32 = nullptr;            // (N,) out or null: the ids as int32, clamped to [-1, 2^31 - 1]
};

// Prefetch distances and store policy, settable from Python for benchmarking (neo._C._set_tuning). Defined
// in cpu_isa.cpp (one instance for every variant).
constexpr int64_t kBwdFar = 128;   // backward: rows ahead (in sorted order) whose weight rows are prefetched into L2
struct Tuning {
  int64_t fwd_prefetch = 32;   // forward, 16-bit tables: ids ahead whose rows are prefetched into L1
  int64_t bwd_lookahead = 16;  // backward: rows ahead (in sorted order) prefetched into L1 (24 on AMD Zen 5, 8 on Intel)
  int64_t fwd_stream = 1;     // forward: pooled rows of whole aligned cache lines written with streaming stores
  int64_t sort_prefetch = 1;  // backward's radix sort: each bucket's next lines prefetched for writing (0 on Zen 5)
  int64_t bwd_far = kBwdFar;  // the same for fp32 tables (0: none; 16-bit tables always kBwdFar)
  int64_t fwd_far = 8 * 32;   // forward, 16-bit tables: ids ahead whose rows are prefetched into L2 (0: none)
  int64_t fwd_prefetch32 = 32;   // forward, fp32 tables: as fwd_prefetch (16 on AMD Zen 3)
  int64_t fwd_far32 = 8 * 32;    // forward, fp32 tables: as fwd_far (0 on AMD Zen 3)
};
Tuning& tuning();            // starts at default_tuning()
Tuning default_tuning();     // this CPU's: bwd_far 0, bwd_lookahead 24 and sort_prefetch 0 on AMD Zen 5
                             // (backward.h, radix_sort.h), bwd_lookahead 8 on Intel, fwd_prefetch32 16,
                             // fwd_far32 0 and bwd_far 0 on AMD Zen 3 (forward.h), the fields' defaults elsewhere

}  // namespace neo
