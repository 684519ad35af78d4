// Position weights' slots, read and gradient (position_weights.h).
#include "position_weights.h"

namespace neo {

namespace {

void check_vector(const at::Tensor& t, at::ScalarType dtype, const char* op, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 1 && t.is_contiguous() && t.scalar_type() == dtype,
              "neo._C.", op, ": ", what, " must be a contiguous 1-D CPU ", dtype, " tensor, got ", t.scalar_type(),
              " ", t.sizes(), " on ", t.device());
}

}  // namespace

std::tuple<at::Tensor, int64_t> position_slots(const at::Tensor& offsets, const at::Tensor& first,
                                               const at::Tensor& limits, int64_t ones, int64_t batch_size,
                                               int64_t n) {
  check_vector(offsets, at::kLong, "position_slots", "offsets");
  check_vector(first, at::kLong, "position_slots", "first");
  check_vector(limits, at::kLong, "position_slots", "limits");
  const int64_t F = first.numel(), B = batch_size;
  TORCH_CHECK(limits.numel() == F, "neo._C.position_slots: ", F, " features' first slots but ", limits.numel(),
              " limits");
  TORCH_CHECK(B >= 0 && offsets.numel() == F * B + 1, "neo._C.position_slots: offsets must hold F * B + 1 = ",
              F * B + 1, " entries, got ", offsets.numel());
  const int64_t* off = offsets.data_ptr<int64_t>();
  TORCH_CHECK(off[0] == 0 && off[F * B] == n, "neo._C.position_slots: offsets run from ", off[0], " to ", off[F * B],
              ", the batch holds ", n, " ids (they must run from 0 to that)");
  const int64_t* fi = first.data_ptr<int64_t>();
  const int64_t* lim = limits.data_ptr<int64_t>();
  at::Tensor slots = at::empty({n}, offsets.options());
  int64_t* s = slots.data_ptr<int64_t>();
  int64_t bad = -1;
  for (int64_t f = 0; f < F; ++f) {
    const int64_t start = fi[f], limit = start < 0 ? 0 : lim[f];
    for (int64_t k = f * B; k < (f + 1) * B; ++k) {
      const int64_t a = off[k], e = off[k + 1];
      TORCH_CHECK(a <= e, "neo._C.position_slots: offsets decrease at bag ", k, " (", a, " then ", e, ")");
      const int64_t weighted = e - a < limit ? e - a : limit;   // ids with a slot of their feature's
      for (int64_t p = 0; p < weighted; ++p) s[a + p] = start + p;
      for (int64_t i = a + weighted; i < e; ++i) s[i] = ones;
      if (start >= 0 && e - a > limit && bad < 0) bad = k;
    }
  }
  return {slots, bad};
}

at::Tensor position_read(const std::vector<at::Tensor>& parts, const at::Tensor& slots) {
  check_vector(slots, at::kLong, "position_read", "slots");
  std::vector<float> table;                            // the parts end to end, then 1
  for (const at::Tensor& p : parts) {
    check_vector(p, at::kFloat, "position_read", "every part");
    table.insert(table.end(), p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
  }
  table.push_back(1.0f);
  const uint64_t T = table.size();
  const int64_t N = slots.numel();
  const int64_t* s = slots.data_ptr<int64_t>();
  at::Tensor out = at::empty({N}, slots.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < N; ++i) {
    TORCH_CHECK(static_cast<uint64_t>(s[i]) < T, "neo._C.position_read: id ", i, "'s slot ", s[i],
                " is outside the table's ", T, " slots");
    o[i] = table[s[i]];
  }
  return out;
}

std::vector<at::Tensor> position_read_backward(const at::Tensor& grad, const at::Tensor& slots,
                                               const std::vector<int64_t>& sizes) {
  check_vector(grad, at::kFloat, "position_read_backward", "grad");
  check_vector(slots, at::kLong, "position_read_backward", "slots");
  TORCH_CHECK(grad.numel() == slots.numel(), "neo._C.position_read_backward: ", grad.numel(), " gradients for ",
              slots.numel(), " slots");
  int64_t T = 1;
  for (int64_t n : sizes) {
    TORCH_CHECK(n >= 0, "neo._C.position_read_backward: a part of ", n, " slots");
    T += n;
  }
  // kLanes sums per slot (id i adds to lane i % kLanes), in double, then added lane by lane: ids of
  // one slot follow one another (a feature's bags of one id), and one sum in memory would make
  // every add wait for the one before (48 us at 16k ids; 8 lanes overlap them).
  constexpr int64_t kLanes = 8;
  std::vector<double> acc(T * kLanes, 0.0);
  const int64_t N = slots.numel();
  const int64_t* s = slots.data_ptr<int64_t>();
  const float* g = grad.data_ptr<float>();
  for (int64_t i = 0; i < N; ++i) {
    TORCH_CHECK(static_cast<uint64_t>(s[i]) < static_cast<uint64_t>(T), "neo._C.position_read_backward: id ", i,
                "'s slot ", s[i], " is outside the table's ", T, " slots");
    acc[s[i] * kLanes + (i & (kLanes - 1))] += g[i];
  }
  std::vector<at::Tensor> out;
  int64_t at = 0;
  for (int64_t n : sizes) {
    at::Tensor t = at::empty({n}, grad.options());
    float* d = t.data_ptr<float>();
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t l = 0; l < kLanes; ++l) sum += acc[(at + j) * kLanes + l];
      d[j] = static_cast<float>(sum);
    }
    out.push_back(t);
    at += n;
  }
  return out;
}

}  // namespace neo
