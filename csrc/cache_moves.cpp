// A cached table's row moves on the CPU: see cache_moves.h. Rows are copied as raw bytes (any
// storage dtype; a row written back and read in again is the same row), each pair of buffers in
// turn, the store's rows prefetched a few ahead (they are random rows of a large table, in
// memory or in a mapped file).
#include "cache_moves.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace neo {
namespace {

// How many rows ahead the store's rows are prefetched (a random row is a DRAM miss, or a page of
// a mapped file).
constexpr int64_t kAhead = 8;

// One buffer's rows as bytes: row r starts at base + r * stride and holds `bytes` bytes.
struct Rows {
  char* base;
  int64_t stride, bytes, count;
  char* row(int64_t r) const { return base + r * stride; }
};

Rows rows_of(const at::Tensor& t, const char* what, size_t i) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() >= 1, "neo._C: cache_swap_rows: ", what, "[", i,
              "] must be a CPU tensor of rows, got ", t.sizes(), " on ", t.device());
  // every row contiguous (its inner dims packed), rows at any stride
  int64_t inner = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    TORCH_CHECK(t.stride(d) == inner || t.size(d) == 1, "neo._C: cache_swap_rows: the rows of ", what, "[", i,
                "] must be contiguous, got strides ", t.strides());
    inner *= t.size(d);
  }
  const int64_t item = static_cast<int64_t>(t.element_size());
  return Rows{static_cast<char*>(t.data_ptr()), t.stride(0) * item, inner * item, t.size(0)};
}

const int64_t* index_of(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(),
              "neo._C: cache_swap_rows: ", what, " must be a contiguous 1-D int64 CPU tensor");
  return t.data_ptr<int64_t>();
}

void check_range(const int64_t* idx, int64_t n, int64_t limit, const char* what) {
  for (int64_t k = 0; k < n; ++k)
    TORCH_CHECK(idx[k] >= 0 && idx[k] < limit, "neo._C: cache_swap_rows: ", what, "[", k, "] = ", idx[k],
                " is outside [0, ", limit, ")");
}

inline void prefetch_row(const char* p, int64_t bytes, bool write) {
  for (int64_t b = 0; b < bytes; b += 64) {
    if (write) __builtin_prefetch(p + b, 1);
    else __builtin_prefetch(p + b, 0);
  }
}

}  // namespace

int64_t cache_swap_rows(const std::vector<at::Tensor>& slot_bufs, const std::vector<at::Tensor>& store_bufs,
                        const at::Tensor& dirty, const at::Tensor& evicted_slots, const at::Tensor& evicted_rows,
                        const at::Tensor& fill_slots, const at::Tensor& fill_rows,
                        const std::optional<at::Tensor>& mark) {
  TORCH_CHECK(!slot_bufs.empty() && slot_bufs.size() == store_bufs.size(),
              "neo._C: cache_swap_rows: the cache's and the store's buffers must come in pairs, got ",
              slot_bufs.size(), " and ", store_bufs.size());
  std::vector<Rows> slot(slot_bufs.size()), store(store_bufs.size());
  for (size_t i = 0; i < slot_bufs.size(); ++i) {
    slot[i] = rows_of(slot_bufs[i], "slot_bufs", i);
    store[i] = rows_of(store_bufs[i], "store_bufs", i);
    TORCH_CHECK(slot_bufs[i].scalar_type() == store_bufs[i].scalar_type() && slot[i].bytes == store[i].bytes,
                "neo._C: cache_swap_rows: pair ", i, ": the cache's rows (", slot_bufs[i].scalar_type(), ", ",
                slot[i].bytes, " bytes) and the store's (", store_bufs[i].scalar_type(), ", ", store[i].bytes,
                " bytes) differ");
    TORCH_CHECK(slot[i].count == slot[0].count && store[i].count == store[0].count,
                "neo._C: cache_swap_rows: pair ", i, " has another number of slots or rows than pair 0");
  }
  const int64_t C = slot[0].count, N = store[0].count;
  TORCH_CHECK(dirty.device().is_cpu() && dirty.scalar_type() == at::kBool && dirty.dim() == 1 &&
                  dirty.is_contiguous() && dirty.numel() == C,
              "neo._C: cache_swap_rows: dirty must be a contiguous (", C, ",) bool CPU tensor");
  const int64_t E = evicted_slots.numel(), M = fill_slots.numel();
  TORCH_CHECK(evicted_rows.numel() == E && fill_rows.numel() == M,
              "neo._C: cache_swap_rows: ", E, " evicted slots but ", evicted_rows.numel(), " evicted rows, ", M,
              " fill slots but ", fill_rows.numel(), " rows to fill");
  const int64_t* es = index_of(evicted_slots, "evicted_slots");
  const int64_t* er = index_of(evicted_rows, "evicted_rows");
  const int64_t* fs = index_of(fill_slots, "fill_slots");
  const int64_t* fr = index_of(fill_rows, "fill_rows");
  check_range(es, E, C, "evicted_slots");
  check_range(er, E, N, "evicted_rows");
  check_range(fs, M, C, "fill_slots");
  check_range(fr, M, N, "fill_rows");
  const int64_t* mk = nullptr;
  int64_t K = 0;
  if (mark.has_value()) {
    mk = index_of(*mark, "mark");
    K = mark->numel();
    check_range(mk, K, C, "mark");
  }
  bool* d = dirty.data_ptr<bool>();

  // The write-back: the dirty victims' rows, in order (a row evicted twice cannot happen: the
  // victims are distinct slots holding distinct rows).
  int64_t written = 0;
  for (size_t i = 0; i < slot.size(); ++i) {
    const Rows& a = slot[i];
    const Rows& b = store[i];
    for (int64_t k = 0; k < E; ++k) {
      if (k + kAhead < E && d[es[k + kAhead]]) prefetch_row(b.row(er[k + kAhead]), b.bytes, true);
      if (d[es[k]]) std::memcpy(b.row(er[k]), a.row(es[k]), a.bytes);
    }
  }
  for (int64_t k = 0; k < E; ++k)
    if (d[es[k]]) {
      d[es[k]] = false;
      ++written;
    }
  // The fill: the missing rows into their slots, marked clean.
  for (size_t i = 0; i < slot.size(); ++i) {
    const Rows& a = slot[i];
    const Rows& b = store[i];
    for (int64_t k = 0; k < M; ++k) {
      if (k + kAhead < M) prefetch_row(b.row(fr[k + kAhead]), b.bytes, false);
      std::memcpy(a.row(fs[k]), b.row(fr[k]), a.bytes);
    }
  }
  for (int64_t k = 0; k < M; ++k) d[fs[k]] = false;
  for (int64_t k = 0; k < K; ++k) d[mk[k]] = true;
  return written;
}

}  // namespace neo
