// Row-range bucketization for the input distribution of row-split tables (row_wise,
// table_row_wise): every id goes to the shard holding its row, re-based to the shard.
//
// Two passes over the ids, one thread (a feature's ids are a few tens of thousands):
// 1. the shard of every id (the number of boundaries at or below it, counted without
//    branches: a binary search mispredicts on random ids, 8 ns an id; -1 outside every
//    shard), counted per (shard, bag);
// 2. every kept id written at its shard's cursor: ids stay in bag order, and in order of
//    occurrence within a bag, as the plain-torch path (a mask per shard) leaves them.
#include "bucketize.h"

#include <algorithm>
#include <vector>

namespace neo {
namespace {

constexpr int64_t kLinear = 16;  // shards up to which an id's shard is a branch-free count

template <typename T>
void bucketize_impl(const T* v, const int64_t* off, int64_t B, const int64_t* bounds, int64_t S, int64_t* lens,
                    T* out, int64_t* sizes, int64_t* pos, std::vector<int32_t>& shard) {
  const int64_t N = off[B] - off[0];
  shard.resize(static_cast<size_t>(N));
  const int64_t lo = bounds[0], hi = bounds[S];
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = off[b] - off[0]; i < off[b + 1] - off[0]; ++i) {
      const int64_t id = static_cast<int64_t>(v[i]);
      int32_t s = -1;
      if (id >= lo && id < hi) {
        if (S <= kLinear) {            // branch-free: ids of a batch fall in random shards
          s = 0;
          for (int64_t k = 1; k < S; ++k) s += id >= bounds[k];
        } else {
          s = static_cast<int32_t>(std::upper_bound(bounds + 1, bounds + S + 1, id) - (bounds + 1));
        }
        ++lens[s * B + b];
      }
      shard[static_cast<size_t>(i)] = s;
    }
  }
  std::vector<int64_t> cursor(static_cast<size_t>(S));
  int64_t acc = 0;
  for (int64_t s = 0; s < S; ++s) {
    int64_t n = 0;
    for (int64_t b = 0; b < B; ++b) n += lens[s * B + b];
    sizes[s] = n;
    cursor[static_cast<size_t>(s)] = acc;
    acc += n;
  }
  for (int64_t i = 0; i < N; ++i) {
    const int32_t s = shard[static_cast<size_t>(i)];
    if (s < 0) continue;
    const int64_t at = cursor[static_cast<size_t>(s)]++;
    out[at] = static_cast<T>(static_cast<int64_t>(v[i]) - bounds[s]);
    if (pos) pos[at] = i;
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bucketize_rows(
    const at::Tensor& values, const at::Tensor& bag_offsets, const at::Tensor& bounds, bool with_positions) {
  TORCH_CHECK(values.device().is_cpu() && values.dim() == 1 && values.is_contiguous() &&
                  (values.scalar_type() == at::kInt || values.scalar_type() == at::kLong),
              "neo._C.bucketize_rows: values must be a contiguous 1-D CPU int32/int64 tensor");
  TORCH_CHECK(bag_offsets.device().is_cpu() && bag_offsets.dim() == 1 && bag_offsets.is_contiguous() &&
                  bag_offsets.scalar_type() == at::kLong && bag_offsets.numel() >= 1,
              "neo._C.bucketize_rows: bag_offsets must be a contiguous 1-D CPU int64 tensor of B + 1 entries");
  TORCH_CHECK(bounds.device().is_cpu() && bounds.dim() == 1 && bounds.is_contiguous() &&
                  bounds.scalar_type() == at::kLong && bounds.numel() >= 2,
              "neo._C.bucketize_rows: bounds must be a contiguous 1-D CPU int64 tensor of S + 1 >= 2 entries");
  const int64_t B = bag_offsets.numel() - 1, S = bounds.numel() - 1;
  const int64_t* off = bag_offsets.data_ptr<int64_t>();
  const int64_t* bd = bounds.data_ptr<int64_t>();
  TORCH_CHECK(off[B] - off[0] == values.numel(), "neo._C.bucketize_rows: bag_offsets span ", off[B] - off[0],
              " ids, values holds ", values.numel());
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK(off[b] <= off[b + 1], "neo._C.bucketize_rows: bag_offsets decrease at ", b);
  for (int64_t s = 0; s < S; ++s) TORCH_CHECK(bd[s] < bd[s + 1], "neo._C.bucketize_rows: bounds must increase");
  at::Tensor lens = at::zeros({S, B}, bag_offsets.options());
  at::Tensor sizes = at::empty({S}, bag_offsets.options());
  at::Tensor out = at::empty({values.numel()}, values.options());
  at::Tensor pos = at::empty({with_positions ? values.numel() : 0}, bag_offsets.options());
  std::vector<int32_t> shard;
  int64_t* p = with_positions ? pos.data_ptr<int64_t>() : nullptr;
  if (values.scalar_type() == at::kInt) {
    bucketize_impl(values.data_ptr<int32_t>(), off, B, bd, S, lens.data_ptr<int64_t>(), out.data_ptr<int32_t>(),
                   sizes.data_ptr<int64_t>(), p, shard);
  } else {
    bucketize_impl(values.data_ptr<int64_t>(), off, B, bd, S, lens.data_ptr<int64_t>(), out.data_ptr<int64_t>(),
                   sizes.data_ptr<int64_t>(), p, shard);
  }
  const int64_t kept = sizes.sum().item<int64_t>();
  return {lens, out.narrow(0, 0, kept), sizes, with_positions ? pos.narrow(0, 0, kept) : pos};
}

}  // namespace neo
