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
#include "interaction.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

namespace neo {
namespace {

typedef float v16 __attribute__((vector_size(64), aligned(4)));   // unaligned loads/stores allowed
constexpr int64_t kL = 16;

inline v16 load(const float* p) { v16 v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }
inline v16 splat(float x) { return v16{} + x; }

// The n vectors of sample b: row 0 is dense[b], row k >= 1 is pooled[b, (k-1) D : k D].
struct Sample {
  const float* dense;
  const float* pooled;
  int64_t D;
  const float* row(int64_t k) const { return k == 0 ? dense : pooled + (k - 1) * D; }
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

// grad v_i = sum_j S[i][j] v_j, written to g0 (i = 0) and grest + (i - 1) D (i >= 1).
// S: (n, n) row-major.
void grad_rows(const Sample& s, int64_t n, const float* S, float* g0, float* grest) {
  const int64_t D = s.D;
  auto out_row = [&](int64_t i) { return i == 0 ? g0 : grest + (i - 1) * D; };
  if (D % kL != 0) {
    for (int64_t i = 0; i < n; ++i) {
      float* g = out_row(i);
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
    const int64_t i1 = std::min(i0 + 1, n - 1);
    for (int64_t d0 = 0; d0 < D; d0 += 4 * kL) {
      const int64_t nv = std::min<int64_t>(4, (D - d0) / kL);
      v16 a0[4] = {}, a1[4] = {};
      for (int64_t j = 0; j < n; ++j) {
        const float* v = s.row(j) + d0;
        const v16 w0 = splat(S[i0 * n + j]), w1 = splat(S[i1 * n + j]);
        for (int64_t u = 0; u < nv; ++u) {
          const v16 x = load(v + u * kL);
          a0[u] += w0 * x;
          a1[u] += w1 * x;
        }
      }
      for (int64_t u = 0; u < nv; ++u) {
        store(out_row(i0) + d0 + u * kL, a0[u]);
        if (i1 != i0) store(out_row(i1) + d0 + u * kL, a1[u]);
      }
    }
  }
}

void check(const at::Tensor& dense, const at::Tensor& pooled, int64_t F) {
  TORCH_CHECK(dense.device().is_cpu() && dense.scalar_type() == at::kFloat && dense.is_contiguous() && dense.dim() == 2,
              "neo._C: dot interaction: dense must be a contiguous (B, D) fp32 CPU tensor");
  const int64_t B = dense.size(0), D = dense.size(1);
  TORCH_CHECK(pooled.device().is_cpu() && pooled.scalar_type() == at::kFloat && pooled.is_contiguous() &&
                  pooled.dim() == 2 && pooled.size(0) == B && pooled.size(1) == F * D,
              "neo._C: dot interaction: pooled must be a contiguous (B, F * D) = (", B, ", ", F * D,
              ") fp32 CPU tensor, got ", pooled.sizes());
  TORCH_CHECK(F >= 1 && F + 1 <= 256, "neo._C: dot interaction supports 1 to 255 features, got ", F);
}

}  // namespace

// Returns out (B, D + P).
at::Tensor dot_interaction_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F) {
  check(dense, pooled, F);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  const int64_t np = (n + kL - 1) / kL * kL;
  at::Tensor out = at::empty({B, D + P}, dense.options());
  const float* dp = dense.data_ptr<float>();
  const float* pp = pooled.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B, 64, [&](int64_t b0, int64_t b1) {
    std::vector<float> vt(D * np);
    for (int64_t b = b0; b < b1; ++b) {
      const Sample s{dp + b * D, pp + b * F * D, D};
      float* o = op + b * (D + P);
      std::memcpy(o, s.dense, D * sizeof(float));
      if (D % kL == 0) pairs_vector(s, n, vt.data(), np, o + D);
      else pairs_scalar(s, n, o + D);
    }
  });
  return out;
}

// Returns (grad_dense (B, D), grad_pooled (B, F * D)) from grad_out (B, D + P).
std::tuple<at::Tensor, at::Tensor> dot_interaction_backward(const at::Tensor& grad_out, const at::Tensor& dense,
                                                            const at::Tensor& pooled, int64_t F) {
  check(dense, pooled, F);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  TORCH_CHECK(grad_out.device().is_cpu() && grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.dim() == 2 && grad_out.size(0) == B && grad_out.size(1) == D + P,
              "neo._C: dot interaction: grad_out must be a contiguous (B, D + P) fp32 CPU tensor");
  at::Tensor gd = at::empty({B, D}, dense.options());
  at::Tensor gp = at::empty({B, F * D}, dense.options());
  const float* go = grad_out.data_ptr<float>();
  const float* dp = dense.data_ptr<float>();
  const float* pp = pooled.data_ptr<float>();
  float* gdp = gd.data_ptr<float>();
  float* gpp = gp.data_ptr<float>();
  at::parallel_for(0, B, 64, [&](int64_t b0, int64_t b1) {
    std::vector<float> S(n * n), g0(D);
    for (int64_t b = b0; b < b1; ++b) {
      const Sample s{dp + b * D, pp + b * F * D, D};
      const float* g = go + b * (D + P);
      int64_t p = D;
      for (int64_t i = 0; i < n; ++i) {
        S[i * n + i] = 0.0f;
        for (int64_t j = i + 1; j < n; ++j) S[i * n + j] = S[j * n + i] = g[p++];
      }
      grad_rows(s, n, S.data(), g0.data(), gpp + b * F * D);
      float* gdb = gdp + b * D;
      for (int64_t d = 0; d < D; ++d) gdb[d] = g[d] + g0[d];          // dense: passed through + its pairs
    }
  });
  return {gd, gp};
}

}  // namespace neo
