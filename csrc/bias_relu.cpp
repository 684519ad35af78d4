// Checks, then the active variant's kernels (csrc/kernels/bias_relu.h).
#include "bias_relu.h"

#include "cpu_isa.h"

namespace neo {
namespace {

void check_matrix(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 2 && t.is_contiguous(),
              "neo._C: bias_relu: ", what, " must be a contiguous 2-D fp32 CPU tensor, got ", t.scalar_type(), " ",
              t.sizes());
}

}  // namespace

at::Tensor bias_relu_(const at::Tensor& y, const at::Tensor& bias) {
  check_matrix(y, "y");
  TORCH_CHECK(bias.device().is_cpu() && bias.scalar_type() == at::kFloat && bias.dim() == 1 && bias.is_contiguous() &&
                  bias.size(0) == y.size(1),
              "neo._C: bias_relu: bias must be a contiguous fp32 CPU tensor of (", y.size(1), ",), got ",
              bias.scalar_type(), " ", bias.sizes());
  kernels().bias_relu(y.data_ptr<float>(), bias.data_ptr<float>(), y.size(0), y.size(1));
  return y;
}

std::tuple<at::Tensor, at::Tensor> relu_bias_backward(const at::Tensor& grad, const at::Tensor& y) {
  check_matrix(grad, "grad");
  check_matrix(y, "y");
  TORCH_CHECK(grad.sizes() == y.sizes(), "neo._C: relu_bias_backward: grad ", grad.sizes(), " and y ", y.sizes(),
              " differ in shape");
  const int64_t rows = y.size(0), N = y.size(1);
  at::Tensor gp = at::empty_like(y);
  at::Tensor gb = at::empty({N}, y.options());
  at::Tensor partial = at::empty({(rows + kBiasReluBlock - 1) / kBiasReluBlock * N}, y.options());
  kernels().relu_bias_backward(grad.data_ptr<float>(), y.data_ptr<float>(), gp.data_ptr<float>(),
                               gb.data_ptr<float>(), partial.data_ptr<float>(), rows, N);
  return {gp, gb};
}

}  // namespace neo
