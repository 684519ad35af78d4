// Fused backward + sparse optimizer step. No dense weight gradient is ever formed.
//
// 1. Keys (parallel over bags): for every id, its global row key = row_offsets[t] + id
//    (ids outside [0, rows) get a sentinel key past every row, so they sort last and are
//    skipped), packed as (key << 32 | ref) with ref = its bag (unweighted) or its position
//    (weighted: bag via a position -> bag array, weight via per_sample_weights). Per bag:
//    the offset of its slice of grad_output and its length for mean pooling (F * B
//    entries, cache-resident).
// 2. Grouping: stable parallel LSD radix sort of the packed items by key (radix_sort.h),
//    only as many key bits as the largest key needs. Occurrences of one row end up
//    adjacent, in order of occurrence.
// 3. Update (parallel over segments of the sorted items, cut at row boundaries, about
//    equally many ids each): per row, sum its gradient occurrences in fp32 into a
//    thread-local D-vector (same order as the reference), then apply the optimizer to the
//    row in place (optimizers.h): weights in their storage dtype (stochastic rounding of
//    fp16/bf16 keyed by (seed, step, element)), state in fp32. Rows 16 items ahead are
//    prefetched into L1 (weights and state with write intent, gradient slices), and, on
//    batches dense in rows, weight and state rows 64 items ahead into L2: rows are random
//    in a large table, so this phase is bound by memory latency. Common D (16, 32, 64,
//    128) get compile-time row lengths (straight-line vector code).
//
// Results do not depend on the number of threads: every row is summed and updated by one
// thread, in a fixed order.
//
// fp-contract=off: the optimizer must round every operation like torch does (no FMA), for
// fp16/bf16 weights to match the reference bit for bit. Set before any include so every
// function of this file has the same options (mixed options would block inlining).
// no-tree-loop-distribute-patterns: keep short per-row loops (zeroing, copies) inline
// rather than calls to memset/memcpy, which cost more than the loops at D = 64.
#pragma GCC optimize("fp-contract=off", "no-tree-loop-distribute-patterns")

#include "embedding_kernels.h"
#include "optimizers.h"
#include "radix_sort.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace neo {
namespace {

// NEO_PROFILE=1 in the environment: print the time of each phase to stderr (diagnostics).
static const bool kProfile = std::getenv("NEO_PROFILE") != nullptr;
using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Per-thread scratch kept between calls (no allocation per call once warm).
template <typename T>
struct Buffer {
  std::unique_ptr<T[]> p;
  int64_t cap = 0;
  T* get(int64_t n) {
    if (n > cap) { p.reset(new T[std::max<int64_t>(n, 1)]); cap = n; }
    return p.get();
  }
};
struct Workspace {
  Buffer<uint64_t> a, b;
  Buffer<uint32_t> bag_of;    // weighted only: bag of each position
  Buffer<int64_t> bag_goff;   // per bag: offset of its slice of grad_output
  Buffer<float> bag_len;      // per bag: its length for mean pooling, 0 for sum
};
thread_local Workspace tls_ws;

// One row: sum its occurrences sorted[j ..] (same key) in fp32, in order of occurrence,
// then apply the optimizer. Returns the index past the row's occurrences.
template <int64_t DC, bool WEIGHTED, typename T>
inline int64_t process_row(const OptParams& o, T* W, float* s0, float* s1, bool rowwise_state, const float* grad,
                           const float* psw, const uint64_t* sorted, const uint32_t* bag_of, const int64_t* bag_goff,
                           const float* bag_len, int64_t j, int64_t end, uint64_t key, int64_t D_, int64_t elem0,
                           float* a, float* wf, bool stochastic, uint64_t sr_key_) {
  const int64_t D = DC ? DC : D_;
  for (int64_t d = 0; d < D; ++d) a[d] = 0.0f;
  do {
    const uint64_t it = sorted[j];
    const uint32_t ref = static_cast<uint32_t>(it);
    const uint32_t fb = WEIGHTED ? bag_of[ref] : ref;
    const float* go = grad + bag_goff[fb];
    const float len = bag_len[fb];
    if (WEIGHTED) {
      const float w = psw[ref];
      if (len != 0.0f) for (int64_t d = 0; d < D; ++d) a[d] += (go[d] / len) * w;
      else for (int64_t d = 0; d < D; ++d) a[d] += go[d] * w;
    } else {
      if (len != 0.0f) for (int64_t d = 0; d < D; ++d) a[d] += go[d] / len;
      else for (int64_t d = 0; d < D; ++d) a[d] += go[d];
    }
    ++j;
  } while (j < end && (sorted[j] >> 32) == key);
  float* st0 = s0 ? (rowwise_state ? s0 + key : s0 + elem0) : nullptr;
  float* st1 = s1 ? s1 + elem0 : nullptr;
  update_row<DC>(o, W + elem0, a, st0, st1, wf, D, stochastic, sr_key_, elem0);
  return j;
}

inline int bit_width(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

// Items are (key << 32 | ref). Unweighted: ref = the id's bag; weighted: ref = its position
// (bag via bag_of, weight via psw). Either way refs increase with the position, so the
// stable sort keeps occurrences of a row in order of occurrence. Per-bag tables
// (F * B entries) are small enough to stay in cache; the gradient slice of a bag is
// grad + bag_goff[bag], divided by bag_len[bag] for mean pooling (as the reference does).
template <typename T, bool WEIGHTED>
int64_t backward_impl(const GroupMeta& m, T* W, float* s0, float* s1, bool rowwise_state,
                      const float* grad, const int64_t* idx, const int64_t* off, const float* psw,
                      const OptParams& o, bool stochastic, uint64_t sr_key_) {
  const int64_t B = m.B, nbags = m.F * B, N = off[nbags];
  if (N == 0) return 0;
  TORCH_CHECK(N < (int64_t(1) << 32) && nbags < (int64_t(1) << 32) && m.total_rows < (int64_t(1) << 31),
              "neo._C: a batch of ", N, " ids over ", m.total_rows, " rows exceeds the CPU kernel's 32-bit keys; "
              "split the group's tables or the batch");
  Workspace& ws = tls_ws;
  uint64_t* items = ws.a.get(N);
  uint64_t* tmp = ws.b.get(N);
  uint32_t* bag_of = WEIGHTED ? ws.bag_of.get(N) : nullptr;
  int64_t* bag_goff = ws.bag_goff.get(nbags);
  float* bag_len = ws.bag_len.get(nbags);
  const uint64_t sentinel = static_cast<uint64_t>(m.total_rows);

  // ---- 1. keys and gradient sources
  auto t0 = Clock::now();
  const int64_t chunks = num_chunks(N + nbags, 1 << 14);
  const std::vector<int64_t> starts = split_bags_by_ids(off, nbags, chunks);
  std::vector<int64_t> invalid(chunks, 0);
  std::vector<uint64_t> max_key(chunks, 0);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t bad = 0;
      uint64_t mk = 0;
      for (int64_t fb = starts[c]; fb < starts[c + 1]; ++fb) {
        const int64_t f = fb / B, b = fb - f * B;
        const int64_t t = m.ftable[f];
        const uint64_t rows = static_cast<uint64_t>(m.rows[t]), r0 = static_cast<uint64_t>(m.roff[t]);
        const int64_t s = off[fb], e = off[fb + 1];
        bag_goff[fb] = b * m.total_dim + m.outoff[f];
        bag_len[fb] = m.fmean[f] ? static_cast<float>(e - s) : 0.0f;
        for (int64_t i = s; i < e; ++i) {
          const uint64_t id = static_cast<uint64_t>(idx[i]);
          uint64_t key = sentinel;
          if (id < rows) key = r0 + id; else ++bad;
          mk = std::max(mk, key);
          items[i] = (key << 32) | static_cast<uint64_t>(WEIGHTED ? i : fb);
          if (WEIGHTED) bag_of[i] = static_cast<uint32_t>(fb);
        }
      }
      invalid[c] = bad;
      max_key[c] = mk;
    }
  });
  int64_t n_invalid = 0;
  uint64_t mk = 0;
  for (int64_t c = 0; c < chunks; ++c) { n_invalid += invalid[c]; mk = std::max(mk, max_key[c]); }
  const int64_t n_valid = N - n_invalid;
  if (n_valid == 0) return n_invalid;

  // ---- 2. group by row
  const double ms1 = ms_since(t0);
  const uint64_t* sorted = radix_sort_by_key(items, tmp, N, bit_width(mk));
  const double ms2 = ms_since(t0);

  // ---- 3. sum per row and update, segments cut at row boundaries
  const int64_t seg = num_chunks(n_valid, 1 << 12);
  std::vector<int64_t> bounds(seg + 1);
  bounds[0] = 0;
  bounds[seg] = n_valid;
  for (int64_t c = 1; c < seg; ++c) {
    int64_t p = std::max(bounds[c - 1], n_valid * c / seg);
    while (p > 0 && p < n_valid && (sorted[p] >> 32) == (sorted[p - 1] >> 32)) ++p;
    bounds[c] = p;
  }
  const int64_t kLookahead = tuning().bwd_lookahead;
  // A second prefetch 4x further ahead, into L2, keeps more misses in flight when the batch
  // touches a large share of the rows (the sorted sweep is then nearly sequential): 13% faster
  // at 326k ids over 400k rows. On sparse batches (one-hot ids over 1.3M rows: 4%) it cost
  // 10%, so it runs only when there are at least 1/8 as many ids as rows.
  const int64_t far = n_valid * 8 >= m.total_rows ? 4 * kLookahead : 0;
  auto bag_of_ref = [&](uint64_t item) -> uint32_t {
    const uint32_t ref = static_cast<uint32_t>(item);
    return WEIGHTED ? bag_of[ref] : ref;
  };
  at::parallel_for(0, seg, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> acc(m.max_dim), wf(m.max_dim);
    for (int64_t c = c0; c < c1; ++c) {
      int64_t j = bounds[c];
      const int64_t end = bounds[c + 1];
      int64_t t = 0;
      // table of a sorted key at or after the current one (keys ascend), and its first element
      auto locate = [&](uint64_t k, int64_t& tt) {
        while (k >= static_cast<uint64_t>(m.roff[tt] + m.rows[tt])) ++tt;
        return m.woff[tt] + (static_cast<int64_t>(k) - m.roff[tt]) * m.dims[tt];
      };
      while (j < end) {
        const uint64_t key = sorted[j] >> 32;
        const int64_t elem0 = locate(key, t);
        const int64_t D = m.dims[t];
        if (j + kLookahead < n_valid) {  // into L1: the row, its state and gradient slice L items ahead
          const uint64_t it2 = sorted[j + kLookahead], k2 = it2 >> 32;
          int64_t t2 = t;
          const int64_t e2 = locate(k2, t2), D2 = m.dims[t2];
          prefetch_row_w(W + e2, D2 * static_cast<int64_t>(sizeof(T)));
          if (rowwise_state) {
            __builtin_prefetch(s0 + k2, 1, 3);
          } else if (s0) {
            prefetch_row_w(s0 + e2, D2 * 4);
            if (s1) prefetch_row_w(s1 + e2, D2 * 4);
          }
          prefetch_row(grad + bag_goff[bag_of_ref(it2)], D2 * 4);
        }
        if (far && j + far < n_valid) {  // into L2: weight and element-wise state rows 4L items ahead
          int64_t t3 = t;
          const int64_t e3 = locate(sorted[j + far] >> 32, t3), D3 = m.dims[t3];
          prefetch_row_w_l2(W + e3, D3 * static_cast<int64_t>(sizeof(T)));
          if (s0 && !rowwise_state) {
            prefetch_row_w_l2(s0 + e3, D3 * 4);
            if (s1) prefetch_row_w_l2(s1 + e3, D3 * 4);
          }
        }
        switch (D) {  // compile-time row lengths for the common D
          case 16: j = process_row<16, WEIGHTED>(o, W, s0, s1, rowwise_state, grad, psw, sorted, bag_of, bag_goff, bag_len, j, end, key, D, elem0, acc.data(), wf.data(), stochastic, sr_key_); break;
          case 32: j = process_row<32, WEIGHTED>(o, W, s0, s1, rowwise_state, grad, psw, sorted, bag_of, bag_goff, bag_len, j, end, key, D, elem0, acc.data(), wf.data(), stochastic, sr_key_); break;
          case 64: j = process_row<64, WEIGHTED>(o, W, s0, s1, rowwise_state, grad, psw, sorted, bag_of, bag_goff, bag_len, j, end, key, D, elem0, acc.data(), wf.data(), stochastic, sr_key_); break;
          case 128: j = process_row<128, WEIGHTED>(o, W, s0, s1, rowwise_state, grad, psw, sorted, bag_of, bag_goff, bag_len, j, end, key, D, elem0, acc.data(), wf.data(), stochastic, sr_key_); break;
          default: j = process_row<0, WEIGHTED>(o, W, s0, s1, rowwise_state, grad, psw, sorted, bag_of, bag_goff, bag_len, j, end, key, D, elem0, acc.data(), wf.data(), stochastic, sr_key_); break;
        }
      }
    }
  });
  if (kProfile) fprintf(stderr, "bwd: keys %.2f sort %.2f update %.2f ms\n", ms1, ms2 - ms1, ms_since(t0) - ms2);
  return n_invalid;
}

template <typename T>
int64_t backward_dispatch(const GroupMeta& m, T* W, float* s0, float* s1, bool rowwise_state, const float* grad,
                          const int64_t* idx, const int64_t* off, const float* psw, const OptParams& o,
                          bool stochastic, uint64_t key) {
  return psw ? backward_impl<T, true>(m, W, s0, s1, rowwise_state, grad, idx, off, psw, o, stochastic, key)
             : backward_impl<T, false>(m, W, s0, s1, rowwise_state, grad, idx, off, psw, o, stochastic, key);
}

}  // namespace

int64_t embedding_backward_update(
    const at::Tensor& weights, const std::vector<at::Tensor>& states, const at::Tensor& grad_output,
    const at::Tensor& indices, const at::Tensor& offsets, const std::optional<at::Tensor>& per_sample_weights,
    const at::Tensor& table_rows, const at::Tensor& table_dims, const at::Tensor& weight_offsets,
    const at::Tensor& row_offsets, const at::Tensor& feature_table, const at::Tensor& output_offsets,
    const at::Tensor& feature_mean, int64_t batch_size,
    int64_t opt_kind, double lr, double eps, double weight_decay, double beta1, double beta2,
    int64_t step, int64_t seed, bool stochastic_rounding) {
  const GroupMeta m = make_meta(table_rows, table_dims, weight_offsets, row_offsets, feature_table,
                                output_offsets, feature_mean, batch_size);
  check_inputs(m, weights, indices, offsets, per_sample_weights);
  TORCH_CHECK(opt_kind >= kSGD && opt_kind <= kLamb, "neo._C: unknown optimizer kind ", opt_kind);
  const bool rowwise = opt_kind == kRowwiseAdagrad;
  const size_t n_states = opt_kind == kSGD ? 0 : (opt_kind == kAdam || opt_kind == kLamb) ? 2 : 1;
  TORCH_CHECK(states.size() == n_states, "neo._C: optimizer expects ", n_states, " state tensors, got ", states.size());
  for (const auto& s : states) {
    TORCH_CHECK(s.device().is_cpu() && s.scalar_type() == at::kFloat && s.is_contiguous(),
                "neo._C: optimizer state must be contiguous CPU fp32");
    TORCH_CHECK(s.numel() >= (rowwise ? m.total_rows : weights.numel()), "neo._C: optimizer state too small");
  }
  TORCH_CHECK(grad_output.device().is_cpu() && grad_output.scalar_type() == at::kFloat && grad_output.is_contiguous() &&
                  grad_output.dim() == 2 && grad_output.size(0) == m.B && grad_output.size(1) == m.total_dim,
              "neo._C: grad_output must be a contiguous (B, total_dim) fp32 CPU tensor");
  if (m.B == 0 || m.F == 0) return 0;
  const OptParams o = make_opt_params(opt_kind, lr, eps, weight_decay, beta1, beta2, step);
  float* s0 = n_states > 0 ? states[0].data_ptr<float>() : nullptr;
  float* s1 = n_states > 1 ? states[1].data_ptr<float>() : nullptr;
  const float* psw = per_sample_weights.has_value() ? per_sample_weights->data_ptr<float>() : nullptr;
  const float* g = grad_output.data_ptr<float>();
  const int64_t* idx = indices.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const uint64_t key = sr_key(seed, step);
  switch (weights.scalar_type()) {
    case at::kFloat:
      return backward_dispatch(m, weights.data_ptr<float>(), s0, s1, rowwise, g, idx, off, psw, o, false, key);
    case at::kHalf:
      return backward_dispatch(m, weights.data_ptr<c10::Half>(), s0, s1, rowwise, g, idx, off, psw, o, stochastic_rounding, key);
    case at::kBFloat16:
      return backward_dispatch(m, weights.data_ptr<c10::BFloat16>(), s0, s1, rowwise, g, idx, off, psw, o, stochastic_rounding, key);
    default:
      TORCH_CHECK(false, "neo._C: weights must be fp32, fp16 or bf16, got ", weights.scalar_type());
  }
  return 0;
}

}  // namespace neo
