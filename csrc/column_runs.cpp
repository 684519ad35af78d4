// See column_runs.h.
#include "column_runs.h"

#include <ATen/Parallel.h>

#include <stdexcept>
#include <string>

namespace neo {
namespace {

struct Mat {
  float* p;
  int64_t stride, cols;
};

std::vector<Mat> matrices(const std::vector<at::Tensor>& ts, const char* what, int64_t rows) {
  std::vector<Mat> out;
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    const std::string name = std::string(what) + " " + std::to_string(i);
    if (t.dim() != 2 || t.scalar_type() != at::kFloat || !t.device().is_cpu())
      throw std::invalid_argument("column_runs: " + name + " must be a 2-D fp32 CPU tensor");
    if (t.size(0) != rows) throw std::invalid_argument("column_runs: " + name + " has " + std::to_string(t.size(0)) +
                                                       " rows, the first source " + std::to_string(rows));
    if (t.size(1) > 1 && t.stride(1) != 1)
      throw std::invalid_argument("column_runs: " + name + " must have unit column stride");
    out.push_back({t.data_ptr<float>(), t.stride(0), t.size(1)});
  }
  return out;
}

}  // namespace

void column_runs(const std::vector<at::Tensor>& srcs, const std::vector<at::Tensor>& dsts, const at::Tensor& runs,
                 double scale) {
  if (srcs.empty()) throw std::invalid_argument("column_runs: no sources");
  const int64_t rows = srcs[0].dim() >= 1 ? srcs[0].size(0) : 0;
  const std::vector<Mat> S = matrices(srcs, "source", rows), Dm = matrices(dsts, "target", rows);
  if (runs.dim() != 2 || runs.size(1) != 6 || runs.scalar_type() != at::kLong || !runs.is_contiguous())
    throw std::invalid_argument("column_runs: runs must be a contiguous (R, 6) int64 tensor");
  const int64_t R = runs.size(0);
  const int64_t* r = runs.data_ptr<int64_t>();
  for (int64_t k = 0; k < R; ++k) {
    const int64_t* x = r + 6 * k;
    const std::string at = "column_runs: run " + std::to_string(k) + " ";
    if (x[0] < 0 || x[0] >= static_cast<int64_t>(S.size()) || x[2] < 0 || x[2] >= static_cast<int64_t>(Dm.size()))
      throw std::invalid_argument(at + "names a source or target that does not exist");
    if (x[4] < 0 || x[1] < 0 || x[1] + x[4] > S[x[0]].cols || x[3] < 0 || x[3] + x[4] > Dm[x[2]].cols)
      throw std::invalid_argument(at + "reaches past its matrices' columns");
    if (x[5] != 0 && x[5] != 1) throw std::invalid_argument(at + "must copy (0) or add (1)");
  }
  const float a = static_cast<float>(scale);
  const bool exact = scale == 1.0;
  at::parallel_for(0, rows, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t k = 0; k < R; ++k) {
        const int64_t* x = r + 6 * k;
        const Mat& s = S[x[0]];
        const Mat& d = Dm[x[2]];
        const float* __restrict__ in = s.p + b * s.stride + x[1];
        float* __restrict__ out = d.p + b * d.stride + x[3];
        const int64_t n = x[4];
        if (x[5]) {
          for (int64_t j = 0; j < n; ++j) out[j] = out[j] + in[j];
        } else if (exact) {
          for (int64_t j = 0; j < n; ++j) out[j] = in[j];    // short runs: inline, not a memcpy call
        } else {
          for (int64_t j = 0; j < n; ++j) out[j] = a * in[j];
        }
      }
    }
  });
}

}  // namespace neo
