// Row-range bucketization of one feature's ids for row-split sharding: checks here, the two
// passes in the active ISA variant (csrc/kernels/bucketize.h).
#include "bucketize.h"

#include "cpu_isa.h"

namespace neo {
namespace {

template <typename T>
void run(const KernelTable& k, const at::Tensor& values, const int64_t* off, int64_t B, const int64_t* bounds,
         int64_t S, at::Tensor& lens, at::Tensor& out, at::Tensor& sizes, int64_t* pos) {
  BucketizeArgs<T> a;
  a.values = values.data_ptr<T>();
  a.off = off;
  a.B = B;
  a.bounds = bounds;
  a.S = S;
  a.lens = lens.data_ptr<int64_t>();
  a.out = out.data_ptr<T>();
  a.sizes = sizes.data_ptr<int64_t>();
  a.pos = pos;
  if constexpr (std::is_same_v<T, int32_t>) k.bucketize_i32(a);
  else k.bucketize_i64(a);
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
  int64_t* p = with_positions ? pos.data_ptr<int64_t>() : nullptr;
  if (values.scalar_type() == at::kInt) run<int32_t>(kernels(), values, off, B, bd, S, lens, out, sizes, p);
  else run<int64_t>(kernels(), values, off, B, bd, S, lens, out, sizes, p);
  const int64_t kept = sizes.sum().item<int64_t>();
  return {lens, out.narrow(0, 0, kept), sizes, with_positions ? pos.narrow(0, 0, kept) : pos};
}

}  // namespace neo
