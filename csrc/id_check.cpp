// Range check of a batch's ids: checks of the arguments here, the pass in the active ISA
// variant (csrc/kernels/id_check.h).
#include "id_check.h"

#include "cpu_isa.h"

namespace neo {

std::tuple<at::Tensor, at::Tensor> check_id_ranges(const at::Tensor& values, const at::Tensor& starts,
                                                   const at::Tensor& rows, bool to_int32) {
  TORCH_CHECK(values.device().is_cpu() && values.dim() == 1 && values.is_contiguous() &&
                  (values.scalar_type() == at::kInt || values.scalar_type() == at::kLong),
              "neo._C.check_id_ranges: values must be a contiguous 1-D CPU int32/int64 tensor, got ",
              values.scalar_type(), " ", values.sizes());
  TORCH_CHECK(rows.device().is_cpu() && rows.dim() == 1 && rows.is_contiguous() && rows.scalar_type() == at::kLong,
              "neo._C.check_id_ranges: rows must be a contiguous 1-D CPU int64 tensor");
  const int64_t F = rows.numel();
  TORCH_CHECK(starts.device().is_cpu() && starts.dim() == 1 && starts.is_contiguous() &&
                  starts.scalar_type() == at::kLong && starts.numel() == F + 1,
              "neo._C.check_id_ranges: starts must be a contiguous 1-D CPU int64 tensor of F + 1 = ", F + 1,
              " entries, got ", starts.sizes());
  const int64_t* st = starts.data_ptr<int64_t>();
  TORCH_CHECK(st[0] == 0 && st[F] == values.numel(), "neo._C.check_id_ranges: starts run from ", st[0], " to ",
              st[F], ", values holds ", values.numel(), " ids (they must run from 0 to that)");
  for (int64_t f = 0; f < F; ++f)
    TORCH_CHECK(st[f] <= st[f + 1], "neo._C.check_id_ranges: starts decrease at feature ", f);
  at::Tensor counts = at::zeros({F}, rows.options());
  at::Tensor out = at::empty({to_int32 ? values.numel() : 0}, values.options().dtype(at::kInt));
  int32_t* o = to_int32 ? out.data_ptr<int32_t>() : nullptr;
  if (values.scalar_type() == at::kInt) {
    IdCheckArgs<int32_t> a{values.data_ptr<int32_t>(), st, rows.data_ptr<int64_t>(), F, counts.data_ptr<int64_t>(), o};
    kernels().id_check_i32(a);
  } else {
    IdCheckArgs<int64_t> a{values.data_ptr<int64_t>(), st, rows.data_ptr<int64_t>(), F, counts.data_ptr<int64_t>(), o};
    kernels().id_check_i64(a);
  }
  return {counts, out};
}

}  // namespace neo
