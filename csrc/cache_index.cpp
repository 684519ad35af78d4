// A cached table's admission and eviction choice on the CPU (see cache_index.h). The reference
// in torch operations costs about 25 small operations an admission plus, for the victims, a
// top-k over every slot and a look-up of the candidates in the window; here one pass over the
// slots, a selection among a few thousand, and the updates row by row
// (tools/bench_cache.py --parts d times the two; docs/benchmarks.md).
#include "cache_index.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace neo {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();   // pinned or never-used (index.py: _PINNED)
constexpr int kGroupShift = 56;
constexpr int kCountBits = 24;
constexpr int kWindowBits = 63;
// How far ahead the random reads of the (N,) per-row arrays (slot_of_row, count, the window's
// mask: megabytes each, their rows read in a batch's order) are prefetched: a few thousand
// misses to DRAM an admission, which the loops' short bodies would otherwise take one or two
// at a time.
constexpr int64_t kAhead = 16;

template <class T>
T* checked(const at::Tensor& t, const char* name, int64_t numel, at::ScalarType type = at::kLong) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous() && t.dim() == 1, "neo._C cache: ",
              name, " must be a contiguous 1-D CPU ", type, " tensor");
  TORCH_CHECK(numel < 0 || t.numel() == numel, "neo._C cache: ", name, " has ", t.numel(), " entries, expected ",
              numel);
  return t.data_ptr<T>();
}

// The k-th smallest (0-based) of v (reordered): quickselect with three-way partitions. The
// keys repeat a lot (lru: one key per batch; lfu: per count and batch), where std::nth_element
// fell back to its heap selection.
int64_t kth(std::vector<int64_t>& v, int64_t k) {
  int64_t lo = 0, hi = static_cast<int64_t>(v.size());
  while (hi - lo > 16) {
    const int64_t a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi - 1];
    const int64_t p = std::max(std::min(a, b), std::min(std::max(a, b), c));   // median of three
    int64_t lt = lo, i = lo, gt = hi;   // [lo, lt) < p, [lt, i) == p, [gt, hi) > p
    while (i < gt) {
      if (v[i] < p) std::swap(v[lt++], v[i++]);
      else if (v[i] > p) std::swap(v[i], v[--gt]);
      else ++i;
    }
    if (k < lt) hi = lt;
    else if (k >= gt) lo = gt;
    else return p;
  }
  std::sort(v.begin() + lo, v.begin() + hi);
  return v[k];
}

// The lookahead window: the group of a row (0 where no batch of the window needs it).
struct Window {
  const int64_t* mask = nullptr;   // (N,) bits; null: no window
  int64_t N = 0;
  int64_t value[64] = {0};

  Window(const std::optional<at::Tensor>& window_mask, const std::optional<at::Tensor>& bit_value) {
    TORCH_CHECK(window_mask.has_value() == bit_value.has_value(), "neo._C cache: window_mask and bit_value go together");
    if (!window_mask) return;
    N = window_mask->numel();
    mask = checked<int64_t>(*window_mask, "window_mask", -1);
    const int64_t* bv = checked<int64_t>(*bit_value, "bit_value", kWindowBits);
    for (int b = 0; b < kWindowBits; ++b) {
      TORCH_CHECK(bv[b] >= 0 && bv[b] <= kWindowBits, "neo._C cache: bit_value entries must be in [0, 63]");
      value[b] = bv[b];
    }
  }
  void prefetch(int64_t row) const {
    if (row >= 0 && row < N) __builtin_prefetch(mask + row);
  }
  int64_t group(int64_t row) const {
    TORCH_CHECK(row >= 0 && row < N, "neo._C cache: a slot holds row ", row, " outside [0, ", N, ")");
    uint64_t bits = static_cast<uint64_t>(mask[row]) & ((uint64_t(1) << kWindowBits) - 1);
    int64_t g = 0;
    for (; bits; bits &= bits - 1) g = std::max(g, value[__builtin_ctzll(bits)]);
    return g;
  }
};

// Scratch reused from call to call (per-call buffers of a large cache's size cost a page fault
// per 4 KiB where freed memory goes back to the kernel), one set per thread.
struct Scratch {
  std::vector<uint64_t> pinned;   // bit per slot
  std::vector<int64_t> keys, cand, ckey, sample;
  std::vector<int64_t> pass_slot, pass_key;        // a pass over every slot: C + 1 entries
  std::vector<std::pair<int64_t, int64_t>> ties;   // (row, slot)
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void pin(Scratch& w, const int64_t* slots, int64_t n, int64_t C) {
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(slots[i] >= 0 && slots[i] < C, "neo._C cache: pinned slot ", slots[i], " outside [0, ", C, ")");
    w.pinned[slots[i] >> 6] |= uint64_t(1) << (slots[i] & 63);
  }
}

// The `need` of the candidates (w.cand: slots in increasing order, keys w.ckey) with the
// smallest (key, row), into out: those below the cut in candidate order, then the ties at the
// cut, by row where some are left out.
void pick(Scratch& w, int64_t need, const int64_t* row_of_slot, int64_t* out) {
  w.keys.assign(w.ckey.begin(), w.ckey.end());
  const int64_t cut = kth(w.keys, need - 1);
  int64_t n = 0;
  w.ties.clear();
  for (size_t i = 0; i < w.cand.size(); ++i) {
    if (w.ckey[i] < cut) out[n++] = w.cand[i];
    else if (w.ckey[i] == cut) w.ties.emplace_back(row_of_slot[w.cand[i]], w.cand[i]);
  }
  const int64_t take = need - n;
  if (take < static_cast<int64_t>(w.ties.size()))   // some ties stay: the lowest rows go (all of them: slot order)
    std::partial_sort(w.ties.begin(), w.ties.begin() + take, w.ties.end());
  for (int64_t i = 0; i < take; ++i) out[n++] = w.ties[i].second;
}

// The victims (cache_index.h) into out (need entries) with w.pinned set; returns the number
// of evictable slots (out untouched where it is below need).
int64_t choose_victims(Scratch& w, const int64_t* key, const int64_t* row_of_slot, int64_t C, int64_t need,
                       const Window& window, int64_t* out) {
  auto evictable_slot = [&](int64_t s) { return key[s] != kNever && !((w.pinned[s >> 6] >> (s & 63)) & 1); };
  // One pass counts the evictable slots and samples their keys (every stride-th slot).
  const int64_t stride = std::max<int64_t>(1, C / 4096);
  int64_t evictable = 0;
  w.sample.clear();
  for (int64_t s0 = 0; s0 < C; s0 += stride) {   // no division per slot
    const int64_t s1 = std::min(C, s0 + stride);
    for (int64_t s = s0; s < s1; ++s) evictable += evictable_slot(s);
    if (evictable_slot(s0)) w.sample.push_back(key[s0]);
  }
  if (evictable < need) return evictable;

  // w.cand: the evictable slots (increasing) whose key is at most the k-th smallest (ties
  // included). A threshold from the sample, with a margin, keeps this to one pass and a small
  // selection; where it falls short of k slots, a second pass takes every evictable slot.
  auto lowest = [&](int64_t k) {
    int64_t t = kNever;
    const int64_t S = static_cast<int64_t>(w.sample.size());
    const int64_t r = S * k / evictable * 3 / 2 + 16;   // rank of the threshold in the sample
    if (r < S) {
      w.keys.assign(w.sample.begin(), w.sample.end());
      t = kth(w.keys, r);
    }
    for (int pass = 0; pass < 2; ++pass, t = kNever) {
      // Branch-free: each slot written at the end, kept where it qualifies (a few percent of
      // the slots do, at random: a branch on it mispredicted at every candidate).
      if (static_cast<int64_t>(w.pass_slot.size()) < C + 1) {   // grown once (no zeroing per pass)
        w.pass_slot.resize(C + 1);
        w.pass_key.resize(C + 1);
      }
      int64_t* cand = w.pass_slot.data();
      int64_t* ckey = w.pass_key.data();
      int64_t n = 0;
      for (int64_t s = 0; s < C; ++s) {
        cand[n] = s;
        ckey[n] = key[s];
        n += key[s] <= t && evictable_slot(s);
      }
      w.cand.assign(cand, cand + n);
      w.ckey.assign(ckey, ckey + n);
      if (n >= k) break;
    }
    w.keys.assign(w.ckey.begin(), w.ckey.end());
    const int64_t cut = kth(w.keys, k - 1);
    size_t n = 0;
    for (size_t i = 0; i < w.cand.size(); ++i)
      if (w.ckey[i] <= cut) {
        w.cand[n] = w.cand[i];
        w.ckey[n++] = w.ckey[i];
      }
    w.cand.resize(n);
    w.ckey.resize(n);
  };

  if (!window.mask) {   // every evictable slot is a candidate
    lowest(need);
    if (need == C) std::copy(w.cand.begin(), w.cand.end(), out);   // every slot goes, in slot order
    else pick(w, need, row_of_slot, out);
    return evictable;
  }
  {
    // The slots whose base key is at most the m-th smallest, m widened until `need` of them
    // have group 0 (or every evictable slot is one): the same answer as looking up every slot
    // (a slot left out has a larger base key, so a larger key, than any looked at).
    for (int64_t m = std::min(evictable, 2 * need);; m = std::min(evictable, 2 * m)) {
      lowest(m);
      int64_t free_of_window = 0;
      const size_t nc = w.cand.size();
      for (size_t i = 0; i < nc; ++i) {
        if (i + kAhead < nc) window.prefetch(row_of_slot[w.cand[i + kAhead]]);
        const int64_t g = window.group(row_of_slot[w.cand[i]]);
        free_of_window += g == 0;
        w.ckey[i] |= g << kGroupShift;
      }
      if (m == evictable || free_of_window >= need) break;
    }
  }
  // The reference takes every candidate in slot order where there are just enough.
  if (static_cast<int64_t>(w.cand.size()) == need) std::copy(w.cand.begin(), w.cand.end(), out);
  else pick(w, need, row_of_slot, out);
  return evictable;
}

}  // namespace

std::tuple<at::Tensor, int64_t> cache_victims(const at::Tensor& key_t, const at::Tensor& pinned_t, int64_t need,
                                              const at::Tensor& row_of_slot_t,
                                              const std::optional<at::Tensor>& window_mask,
                                              const std::optional<at::Tensor>& bit_value) {
  const int64_t C = key_t.numel();
  const int64_t* key = checked<int64_t>(key_t, "key", -1);
  const int64_t* row_of_slot = checked<int64_t>(row_of_slot_t, "row_of_slot", C);
  const int64_t* pinned = checked<int64_t>(pinned_t, "pinned", -1);
  TORCH_CHECK(need >= 1, "neo._C cache: need must be >= 1, got ", need);
  const Window window(window_mask, bit_value);
  Scratch& w = scratch();
  w.pinned.assign((C + 63) / 64, 0);
  pin(w, pinned, pinned_t.numel(), C);
  at::Tensor out = at::empty({need}, at::kLong);
  const int64_t evictable = choose_victims(w, key, row_of_slot, C, need, window, out.data_ptr<int64_t>());
  if (evictable < need) return {at::empty({0}, at::kLong), evictable};
  return {out, evictable};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t> cache_admit(
    const at::Tensor& rows_t, int64_t seq, const at::Tensor& slot_of_row_t, const at::Tensor& row_of_slot_t,
    const at::Tensor& key_t, const std::optional<at::Tensor>& count_t, const at::Tensor& free_t,
    const at::Tensor& pinned_t, const std::optional<at::Tensor>& window_mask,
    const std::optional<at::Tensor>& bit_value) {
  const int64_t N = slot_of_row_t.numel(), C = row_of_slot_t.numel(), U = rows_t.numel();
  const int64_t* rows = checked<int64_t>(rows_t, "rows", -1);
  int32_t* slot_of_row = checked<int32_t>(slot_of_row_t, "slot_of_row", N, at::kInt);
  int64_t* row_of_slot = checked<int64_t>(row_of_slot_t, "row_of_slot", C);
  int64_t* key = checked<int64_t>(key_t, "key", C);
  int32_t* count = count_t ? checked<int32_t>(*count_t, "count", N, at::kInt) : nullptr;
  const int64_t* free = checked<int64_t>(free_t, "free", -1);
  const int64_t* pinned = checked<int64_t>(pinned_t, "pinned", -1);
  const Window window(window_mask, bit_value);
  TORCH_CHECK(seq >= 1 && seq < (int64_t(1) << 32), "neo._C cache: seq must be in [1, 2^32), got ", seq);
  for (int64_t i = 0; i < U; ++i)
    TORCH_CHECK(rows[i] >= 0 && rows[i] < N && (i == 0 || rows[i] > rows[i - 1]), "neo._C cache: rows must be sorted, "
                "unique and in [0, ", N, "): entry ", i, " is ", rows[i]);
  const int64_t F = free_t.numel();
  for (int64_t i = 0; i < F; ++i)
    TORCH_CHECK(free[i] >= 0 && free[i] < C, "neo._C cache: free slot ", free[i], " outside [0, ", C, ")");

  // The batch's slots (hits now, misses below), its misses; the hits are pinned with the
  // other batches in flight. Every check comes before the first write.
  Scratch& w = scratch();
  w.pinned.assign((C + 63) / 64, 0);
  pin(w, pinned, pinned_t.numel(), C);
  at::Tensor slots_t = at::empty({U}, at::kLong);
  int64_t* slots = slots_t.data_ptr<int64_t>();
  int64_t M = 0;
  for (int64_t i = 0; i < U; ++i) {
    if (i + kAhead < U) {
      __builtin_prefetch(slot_of_row + rows[i + kAhead]);
      if (count) __builtin_prefetch(count + rows[i + kAhead], 1);
    }
    slots[i] = slot_of_row[rows[i]];
    if (slots[i] >= 0) {
      TORCH_CHECK(slots[i] < C, "neo._C cache: row ", rows[i], " has slot ", slots[i], " outside [0, ", C, ")");
      w.pinned[slots[i] >> 6] |= uint64_t(1) << (slots[i] & 63);
    } else {
      ++M;
    }
  }
  if (count)
    for (int64_t i = 0; i < U; ++i) ++count[rows[i]];
  at::Tensor miss_t = at::empty({M}, at::kLong);
  int64_t* miss_rows = miss_t.data_ptr<int64_t>();
  for (int64_t i = 0, m = 0; i < U; ++i)
    if (slots[i] < 0) miss_rows[m++] = rows[i];
  const int64_t taken = std::min(M, F), need = M - taken;
  at::Tensor fill_t = at::empty({M}, at::kLong);
  int64_t* fill = fill_t.data_ptr<int64_t>();
  std::copy(free, free + taken, fill);
  int64_t evictable = 0;
  if (need > 0) {
    evictable = choose_victims(w, key, row_of_slot, C, need, window, fill + taken);
    if (evictable < need) {
      at::Tensor none = at::empty({0}, at::kLong);
      return {none, miss_t, none, none, none, U - M, 0, evictable};
    }
  }
  at::Tensor evicted_slots_t = fill_t.slice(0, taken).clone();
  at::Tensor evicted_rows_t = at::empty({need}, at::kLong);
  int64_t* evicted_rows = evicted_rows_t.data_ptr<int64_t>();
  for (int64_t e = 0; e < need; ++e) {
    if (e + kAhead < need) {
      const int64_t r = row_of_slot[fill[taken + e + kAhead]];
      if (r >= 0 && r < N) __builtin_prefetch(slot_of_row + r, 1);
    }
    evicted_rows[e] = row_of_slot[fill[taken + e]];
    TORCH_CHECK(evicted_rows[e] >= 0 && evicted_rows[e] < N, "neo._C cache: evicted slot ", fill[taken + e],
                " holds row ", evicted_rows[e]);
    slot_of_row[evicted_rows[e]] = -1;
  }
  for (int64_t m = 0; m < M; ++m) {
    row_of_slot[fill[m]] = miss_rows[m];
    slot_of_row[miss_rows[m]] = static_cast<int32_t>(fill[m]);
  }
  for (int64_t i = 0, m = 0; i < U; ++i) {
    if (slots[i] < 0) slots[i] = fill[m++];
    const int64_t c = count ? std::min<int64_t>(count[rows[i]], (int64_t(1) << kCountBits) - 1) : 0;
    key[slots[i]] = count ? (c << 32) | seq : seq;
  }
  return {slots_t, miss_t, fill_t, evicted_rows_t, evicted_slots_t, U - M, taken, evictable};
}

void cache_window_update(const at::Tensor& mask_t, const std::vector<at::Tensor>& clear_rows,
                         const std::vector<int64_t>& clear_bits, const std::vector<at::Tensor>& set_rows,
                         const std::vector<int64_t>& set_bits) {
  const int64_t N = mask_t.numel();
  int64_t* mask = checked<int64_t>(mask_t, "window_mask", -1);
  TORCH_CHECK(clear_rows.size() == clear_bits.size() && set_rows.size() == set_bits.size(),
              "neo._C cache: one bit per batch of rows");
  auto apply = [&](const std::vector<at::Tensor>& rows_of, const std::vector<int64_t>& bits, bool set) {
    for (size_t k = 0; k < rows_of.size(); ++k) {
      TORCH_CHECK(bits[k] >= 0 && bits[k] < kWindowBits, "neo._C cache: window bit ", bits[k], " outside [0, 63)");
      const int64_t* rows = checked<int64_t>(rows_of[k], "window rows", -1);
      const int64_t n = rows_of[k].numel(), b = int64_t(1) << bits[k];
      for (int64_t i = 0; i < n; ++i)
        TORCH_CHECK(rows[i] >= 0 && rows[i] < N, "neo._C cache: window row ", rows[i], " outside [0, ", N, ")");
      for (int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) __builtin_prefetch(mask + rows[i + kAhead], 1);
        mask[rows[i]] = set ? mask[rows[i]] | b : mask[rows[i]] & ~b;
      }
    }
  };
  apply(clear_rows, clear_bits, false);
  apply(set_rows, set_bits, true);
}

}  // namespace neo
