// Shared helpers of the CPU embedding kernels: group metadata, dtype conversions, prefetch,
// partitioning of bags into balanced chunks.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace neo {

// Static metadata of one group (see neo/embedding/layout.py), read once per call from the
// layout's int64 tensors (T tables, F features; all tiny).
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

inline const int64_t* int64_ptr(const at::Tensor& t, const char* name, int64_t numel) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous(),
              "neo._C: ", name, " must be a contiguous CPU int64 tensor");
  TORCH_CHECK(t.numel() == numel, "neo._C: ", name, " has ", t.numel(), " entries, expected ", numel);
  return t.data_ptr<int64_t>();
}

inline GroupMeta make_meta(const at::Tensor& table_rows, const at::Tensor& table_dims,
                           const at::Tensor& weight_offsets, const at::Tensor& row_offsets,
                           const at::Tensor& feature_table, const at::Tensor& output_offsets,
                           const at::Tensor& feature_mean, int64_t batch_size) {
  GroupMeta m;
  m.T = table_rows.numel();
  m.F = feature_table.numel();
  m.B = batch_size;
  m.rows = int64_ptr(table_rows, "table_rows", m.T);
  m.dims = int64_ptr(table_dims, "table_dims", m.T);
  m.woff = int64_ptr(weight_offsets, "weight_offsets", m.T);
  m.roff = int64_ptr(row_offsets, "row_offsets", m.T);
  m.ftable = int64_ptr(feature_table, "feature_table", m.F);
  m.outoff = int64_ptr(output_offsets, "output_offsets", m.F + 1);
  m.fmean = int64_ptr(feature_mean, "feature_mean", m.F);
  m.total_dim = m.outoff[m.F];
  for (int64_t t = 0; t < m.T; ++t) {
    m.total_rows += m.rows[t];
    m.max_dim = std::max(m.max_dim, m.dims[t]);
  }
  for (int64_t f = 0; f < m.F; ++f) {
    TORCH_CHECK(m.ftable[f] >= 0 && m.ftable[f] < m.T, "neo._C: feature_table out of range");
    TORCH_CHECK(m.outoff[f + 1] - m.outoff[f] == m.dims[m.ftable[f]], "neo._C: output_offsets disagree with table_dims");
  }
  return m;
}

// ---------------------------------------------------------------------------------------
// Storage dtype <-> fp32. Loads are exact; stores round to nearest even like torch's .to().
inline void load_f32(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

inline void load_f32(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {  // bf16 is the top half of an fp32: a shift (vectorizes)
    uint32_t b = static_cast<uint32_t>(s[i]) << 16;
    std::memcpy(dst + i, &b, 4);
  }
}

inline void load_f32(const c10::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Row of any storage dtype as fp32: fp32 rows are used in place, others converted into buf.
inline const float* row_f32(const float* src, float*, int64_t) { return src; }
template <typename T>
inline const float* row_f32(const T* src, float* buf, int64_t n) {
  load_f32(src, buf, n);
  return buf;
}

// ---------------------------------------------------------------------------------------
// Every 64-byte line of [p, p + bytes): WRITE = with write intent; LOCALITY 3 = into L1,
// 1 = into L2 only (the far prefetches, which keep more misses in flight).
template <int WRITE, int LOCALITY>
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, WRITE, LOCALITY);
}
inline void prefetch_row(const void* p, int64_t bytes) { prefetch_lines<0, 3>(p, bytes); }
inline void prefetch_row_w(const void* p, int64_t bytes) { prefetch_lines<1, 3>(p, bytes); }
inline void prefetch_row_l2(const void* p, int64_t bytes) { prefetch_lines<0, 1>(p, bytes); }
inline void prefetch_row_w_l2(const void* p, int64_t bytes) { prefetch_lines<1, 1>(p, bytes); }

// Split bags [0, nbags) into `chunks` contiguous ranges holding about equally many ids
// (bag lengths vary a lot: equal bag counts would leave one thread with the long bags).
inline std::vector<int64_t> split_bags_by_ids(const int64_t* offsets, int64_t nbags, int64_t chunks) {
  std::vector<int64_t> starts(chunks + 1);
  const int64_t n0 = offsets[0], n = offsets[nbags] - n0;
  starts[0] = 0;
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t target = n0 + n * c / chunks;
    // first bag whose start offset is >= target
    int64_t b = std::lower_bound(offsets, offsets + nbags, target) - offsets;
    starts[c] = std::max(starts[c - 1], std::min(b, nbags));
  }
  starts[chunks] = nbags;
  return starts;
}

// Tuning knobs (prefetch distances), settable from Python for benchmarking (neo._C._set_tuning).
struct Tuning {
  int64_t fwd_prefetch = 32;   // forward: ids ahead whose rows are prefetched
  int64_t bwd_lookahead = 16;  // backward: sorted items ahead whose rows are prefetched
};
inline Tuning& tuning() { static Tuning t; return t; }

inline int64_t num_chunks(int64_t work, int64_t min_per_chunk) {
  int64_t t = at::get_num_threads();
  int64_t by_work = std::max<int64_t>(1, work / std::max<int64_t>(1, min_per_chunk));
  return std::max<int64_t>(1, std::min(t, by_work));
}

}  // namespace neo
