// A batch's distinct rows: see unique_rows.h. Each valid id is packed with its position
// (id << 32 | i) and the items sorted by id, least significant digit first, a digit of at most
// 11 bits a pass (a histogram of 2048 counts): no comparisons, where a comparison sort's branches
// mispredict on every new batch (docs/cache.md has the figures). Then one scan assigns each id
// its row's position.
#include "unique_rows.h"

#include <c10/util/Exception.h>

#include <vector>

namespace neo {

std::tuple<at::Tensor, at::Tensor> unique_rows(const at::Tensor& ids_t, int64_t num_rows) {
  TORCH_CHECK(ids_t.device().is_cpu() && ids_t.scalar_type() == at::kLong && ids_t.dim() == 1,
              "neo._C: unique_rows: ids must be a 1-D int64 CPU tensor");
  TORCH_CHECK(num_rows >= 1 && num_rows <= (int64_t(1) << 32), "neo._C: unique_rows: num_rows must be in [1, 2^32], "
              "got ", num_rows);
  const at::Tensor ids_c = ids_t.contiguous();
  const int64_t n = ids_c.numel();
  TORCH_CHECK(n < (int64_t(1) << 32), "neo._C: unique_rows: at most 2^32 - 1 ids, got ", n);
  const int64_t* ids = ids_c.data_ptr<int64_t>();
  at::Tensor where_t = at::empty({n}, at::kLong);
  int64_t* where = where_t.data_ptr<int64_t>();

  std::vector<uint64_t> a, b;
  a.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < num_rows) a.push_back(static_cast<uint64_t>(ids[i]) << 32 | static_cast<uint64_t>(i));
    else where[i] = -1;
  }
  const int64_t m = static_cast<int64_t>(a.size());
  b.resize(m);
  const int bits = num_rows > 1 ? 64 - __builtin_clzll(static_cast<uint64_t>(num_rows - 1)) : 0;
  const int passes = (bits + 10) / 11;
  if (m > 1 && passes > 0) {
    const int digit_bits = (bits + passes - 1) / passes;
    const uint64_t mask = (uint64_t(1) << digit_bits) - 1;
    std::vector<int64_t> hist(int64_t(1) << digit_bits);
    for (int p = 0; p < passes; ++p) {
      const int shift = 32 + p * digit_bits;
      std::fill(hist.begin(), hist.end(), 0);
      for (int64_t i = 0; i < m; ++i) ++hist[(a[i] >> shift) & mask];
      int64_t run = 0;
      for (int64_t& h : hist) {
        const int64_t c = h;
        h = run;
        run += c;
      }
      for (int64_t i = 0; i < m; ++i) b[hist[(a[i] >> shift) & mask]++] = a[i];
      a.swap(b);
    }
  }
  // distinct rows, and each id's position among them
  int64_t U = 0;
  for (int64_t i = 0; i < m; ++i) {
    if (i == 0 || (a[i] >> 32) != (a[i - 1] >> 32)) b[U++] = a[i] >> 32;
    where[a[i] & 0xffffffffu] = U - 1;
  }
  at::Tensor rows_t = at::empty({U}, at::kLong);
  int64_t* rows = rows_t.data_ptr<int64_t>();
  for (int64_t u = 0; u < U; ++u) rows[u] = static_cast<int64_t>(b[u]);
  return {rows_t, where_t};
}

}  // namespace neo
