// DLRM's dot interaction, fused: forward and backward of
//
//     v = [dense, pooled_1 .. pooled_F]            (B, n, D), n = F + 1
//     out = [dense, (v_i . v_j for i < j)]         (B, D + P), P = n (n - 1) / 2, pairs in
//                                                  row-major upper-triangle order
//
// without materializing v, the (B, n, n) Gram matrix or the concatenations. The reference
// is neo.models.interaction.DotInteraction's torch path (one bmm and a gather); this file
// computes the same values with a different summation order (fp32, tolerance-equal).
//
// Per sample, everything (n * D floats, 6.9 KB at n 27, D 64) sits in L1:
//   forward:  Vt = v^T (D, n padded to 16); rows i of the Gram matrix, four at a time,
//             as sum_d v_i[d] * Vt[d, :] (broadcast-multiply-add on 16-float vectors,
//             eight independent accumulators); only columns j > i are written.
//   backward: S (n, n) symmetric with S[i][j] = S[j][i] = grad of pair (i, j), zero
//             diagonal; grad v_i = sum_j S[i][j] v_j, two rows at a time.
// Vectors are GCC vector extensions (lowered to AVX-512 / AVX2 / SSE as compiled). D not a
// multiple of 16 takes a scalar path.
//
// Pooled layout: either a contiguous (B, F * D) tensor, or any flat buffer in which feature
// k of sample b starts at offsets[k] + b * strides[k] (e.g. the source-major output of the
// pooled AlltoAll, read in place: no assembling copy). Gradients go back in the same layout,
// multiplied by grad_scale (the sharded collection's 1 / W), into a buffer like `pooled`.
#include "interaction.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

namespace neo {
namespace {

typedef float v16 __attribute__((vector_size(64), aligned(4)));   // unaligned loads/stores allowed
constexpr int64_t kL = 16;

inline v16 load(const float* p) { v16 v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }
inline v16 splat(float x) { return v16{} + x; }

// Where feature k of sample b starts in the pooled buffer: off[k] + b * stride[k].
struct Layout {
  std::vector<int64_t> off, stride;
};

// The n vectors of one sample: row 0 is its dense vector, row k >= 1 its feature k - 1.
struct Sample {
  const float* rows[256];
  int64_t D;
  Sample(const float* dense, const float* pooled, const Layout& L, int64_t b, int64_t D_) : D(D_) {
    rows[0] = dense;
    for (size_t k = 0; k < L.off.size(); ++k) rows[k + 1] = pooled + L.off[k] + b * L.stride[k];
  }
  const float* row(int64_t k) const { return rows[k]; }
};

// Rows r[0..4) of the Gram matrix, columns [c, c + C) chunks of 16, into row_buf.
template <int C>
inline void gram_block(const float* const* r, const float* col, int64_t np, int64_t D, int64_t rows,
                       float (*row_buf)[256], int64_t c) {
  v16 a[4][C] = {};
  for (int64_t d = 0; d < D; ++d) {
    v16 x[C];
    for (int u = 0; u < C; ++u) x[u] = load(col + d * np + u * kL);
    for (int q = 0; q < 4; ++q) {
      const v16 w = splat(r[q][d]);
      for (int u = 0; u < C; ++u) a[q][u] += w * x[u];
    }
  }
  for (int64_t q = 0; q < rows; ++q)
    for (int u = 0; u < C; ++u) store(row_buf[q] + (c + u) * kL, a[q][u]);
}

// out[p] = v_i . v_j over pairs i < j (row-major), D % 16 == 0. vt: scratch of D * np floats.
void pairs_vector(const Sample& s, int64_t n, float* vt, int64_t np, float* out) {
  const int64_t D = s.D;
  for (int64_t k = 0; k < n; ++k) {                       // transpose into Vt (D, np)
    const float* r = s.row(k);
    for (int64_t d = 0; d < D; ++d) vt[d * np + k] = r[d];
  }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t k = n; k < np; ++k) vt[d * np + k] = 0.0f;
  const int64_t nc = np / kL;
  float row_buf[4][256];                                  // np <= 256 (checked by the caller)
  int64_t p = 0;
  for (int64_t i0 = 0; i0 < n - 1; i0 += 4) {
    const int64_t rows = std::min<int64_t>(4, n - 1 - i0);
    const int64_t c0 = (i0 + 1) / kL;                     // first column chunk with some j > i0
    for (int64_t c = c0; c < nc; c += 2) {
      const float* r[4];
      for (int64_t q = 0; q < 4; ++q) r[q] = s.row(std::min(i0 + q, n - 1));
      if (c + 1 < nc) gram_block<2>(r, vt + c * kL, np, D, rows, row_buf, c);
      else gram_block<1>(r, vt + c * kL, np, D, rows, row_buf, c);
    }
    for (int64_t q = 0; q < rows; ++q) {
      const int64_t i = i0 + q;
      for (int64_t j = i + 1; j < n; ++j) out[p++] = row_buf[q][j];
    }
  }
}

void pairs_scalar(const Sample& s, int64_t n, float* out) {
  int64_t p = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) {
      const float* a = s.row(i);
      const float* b = s.row(j);
      float acc = 0.0f;
      for (int64_t d = 0; d < s.D; ++d) acc += a[d] * b[d];
      out[p++] = acc;
    }
}

// Rows i0 and i0 + 1 (if < n) of S v, columns [d0, d0 + 16 NV).
template <int NV>
inline void grad_block(const Sample& s, int64_t n, const float* S, float* const* out, int64_t i0, int64_t d0) {
  const int64_t i1 = std::min(i0 + 1, n - 1);
  v16 a0[NV] = {}, a1[NV] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float* v = s.row(j) + d0;
    const v16 w0 = splat(S[i0 * n + j]), w1 = splat(S[i1 * n + j]);
    for (int u = 0; u < NV; ++u) {
      const v16 x = load(v + u * kL);
      a0[u] += w0 * x;
      a1[u] += w1 * x;
    }
  }
  for (int u = 0; u < NV; ++u) {
    store(out[i0] + d0 + u * kL, a0[u]);
    if (i1 != i0) store(out[i1] + d0 + u * kL, a1[u]);
  }
}

// grad v_i = sum_j S[i][j] v_j, written to out[i]. S: (n, n) row-major.
void grad_rows(const Sample& s, int64_t n, const float* S, float* const* out) {
  const int64_t D = s.D;
  if (D % kL != 0) {
    for (int64_t i = 0; i < n; ++i) {
      float* g = out[i];
      for (int64_t d = 0; d < D; ++d) g[d] = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float w = S[i * n + j];
        const float* v = s.row(j);
        for (int64_t d = 0; d < D; ++d) g[d] += w * v[d];
      }
    }
    return;
  }
  for (int64_t i0 = 0; i0 < n; i0 += 2) {
    for (int64_t d0 = 0; d0 < D; d0 += 4 * kL) {
      switch (std::min<int64_t>(4, (D - d0) / kL)) {   // compile-time widths: accumulators stay in registers
        case 4: grad_block<4>(s, n, S, out, i0, d0); break;
        case 3: grad_block<3>(s, n, S, out, i0, d0); break;
        case 2: grad_block<2>(s, n, S, out, i0, d0); break;
        default: grad_block<1>(s, n, S, out, i0, d0); break;
      }
    }
  }
}

// Validates the inputs and returns the pooled layout.
Layout layout_of(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                 const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  TORCH_CHECK(dense.device().is_cpu() && dense.scalar_type() == at::kFloat && dense.is_contiguous() && dense.dim() == 2,
              "neo._C: dot interaction: dense must be a contiguous (B, D) fp32 CPU tensor");
  TORCH_CHECK(F >= 1 && F + 1 <= 256, "neo._C: dot interaction supports 1 to 255 features, got ", F);
  TORCH_CHECK(pooled.device().is_cpu() && pooled.scalar_type() == at::kFloat && pooled.is_contiguous(),
              "neo._C: dot interaction: pooled must be a contiguous fp32 CPU tensor");
  const int64_t B = dense.size(0), D = dense.size(1);
  Layout L;
  L.off.resize(F);
  L.stride.resize(F);
  if (!offsets.has_value()) {
    TORCH_CHECK(!strides.has_value(), "neo._C: dot interaction: feature strides given without offsets");
    TORCH_CHECK(pooled.dim() == 2 && pooled.size(0) == B && pooled.size(1) == F * D,
                "neo._C: dot interaction: pooled must be (B, F * D) = (", B, ", ", F * D, "), got ", pooled.sizes());
    for (int64_t k = 0; k < F; ++k) { L.off[k] = k * D; L.stride[k] = F * D; }
    return L;
  }
  TORCH_CHECK(strides.has_value(), "neo._C: dot interaction: feature offsets given without strides");
  TORCH_CHECK(pooled.numel() == B * F * D, "neo._C: dot interaction: the ", B, " x ", F, " vectors of ", D,
              " floats must tile the pooled buffer, which has ", pooled.numel(), " elements");
  for (const at::Tensor* t : {&*offsets, &*strides})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == F,
                "neo._C: dot interaction: feature offsets and strides must be (F,) = (", F, ",) int64 CPU tensors");
  const int64_t* o = offsets->data_ptr<int64_t>();
  const int64_t* st = strides->data_ptr<int64_t>();
  for (int64_t k = 0; k < F; ++k) {
    TORCH_CHECK(o[k] >= 0 && st[k] >= 0 && o[k] + (B > 0 ? (B - 1) * st[k] : 0) + D <= pooled.numel(),
                "neo._C: dot interaction: feature ", k, " (offset ", o[k], ", stride ", st[k],
                ") reaches past the pooled buffer of ", pooled.numel(), " elements");
    L.off[k] = o[k];
    L.stride[k] = st[k];
  }
  return L;
}

}  // namespace

at::Tensor dot_interaction_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                  const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  const int64_t np = (n + kL - 1) / kL * kL;
  at::Tensor out = at::empty({B, D + P}, dense.options());
  const float* dp = dense.data_ptr<float>();
  const float* pp = pooled.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B, 64, [&](int64_t b0, int64_t b1) {
    std::vector<float> vt(D * np);
    for (int64_t b = b0; b < b1; ++b) {
      const Sample s(dp + b * D, pp, L, b, D);
      float* o = op + b * (D + P);
      std::memcpy(o, s.row(0), D * sizeof(float));
      if (D % kL == 0) pairs_vector(s, n, vt.data(), np, o + D);
      else pairs_scalar(s, n, o + D);
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> dot_interaction_backward(
    const at::Tensor& grad_out, const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
    const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides, double grad_scale) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  TORCH_CHECK(grad_out.device().is_cpu() && grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.dim() == 2 && grad_out.size(0) == B && grad_out.size(1) == D + P,
              "neo._C: dot interaction: grad_out must be a contiguous (B, D + P) fp32 CPU tensor");
  at::Tensor gd = at::empty({B, D}, dense.options());
  at::Tensor gp = at::empty_like(pooled);   // every element is written below (layout_of: the vectors tile it)
  const float scale = static_cast<float>(grad_scale);
  const float* go = grad_out.data_ptr<float>();
  const float* dp = dense.data_ptr<float>();
  const float* pp = pooled.data_ptr<float>();
  float* gdp = gd.data_ptr<float>();
  float* gpp = gp.data_ptr<float>();
  at::parallel_for(0, B, 64, [&](int64_t b0, int64_t b1) {
    std::vector<float> S(n * n), g0(D);
    float* outs[256];
    for (int64_t b = b0; b < b1; ++b) {
      const Sample s(dp + b * D, pp, L, b, D);
      const float* g = go + b * (D + P);
      int64_t p = D;
      for (int64_t i = 0; i < n; ++i) {
        S[i * n + i] = 0.0f;
        for (int64_t j = i + 1; j < n; ++j) S[i * n + j] = S[j * n + i] = g[p++];
      }
      outs[0] = g0.data();
      for (int64_t k = 0; k < F; ++k) outs[k + 1] = gpp + L.off[k] + b * L.stride[k];
      grad_rows(s, n, S.data(), outs);
      float* gdb = gdp + b * D;
      for (int64_t d = 0; d < D; ++d) gdb[d] = g[d] + g0[d];          // dense: passed through + its pairs
      if (scale != 1.0f)                                               // as torch.mul(grad, scale): one rounding
        for (int64_t k = 1; k < n; ++k)
          for (int64_t d = 0; d < D; ++d) outs[k][d] = outs[k][d] * scale;
    }
  });
  return {gd, gp};
}

}  // namespace neo
