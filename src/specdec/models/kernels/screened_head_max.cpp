// Each row's greedy token over a slice of a bfloat16 LM head and its logit: screened_columns' candidates
// (avx2_screened_columns.cpp), scored exactly with this build's rows_linear, and the first maximum among each
// row's own candidates. The bits are those of rows_linear over the whole slice, since every logit is one dot
// product with a fixed order whatever else shares the call, and a row's candidates come in column order.
//
// Why in C++: column_screen.py did the union, the scoring and the per-row masked argmax in about ten torch
// calls, 0.3-0.6 ms a call on a 2-core EPYC: 3% of a one-row decode step, and a verification step's early exit
// calls it once per vocabulary slice (up to five times).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

at::Tensor rows_linear(at::Tensor x, at::Tensor w);  // this build's (avx2_, bf16_ or amx_rows_linear.cpp)
std::vector<at::Tensor> screened_columns(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor c1, at::Tensor c2,
                                         int64_t start, int64_t stop);

// (values [M] float32, indices [M] int64 within [start, stop)): each row's first maximum of rows_linear(x, w)
// over the columns [start, stop), as greedy_argmax picks it (the first maximum, or the first NaN), found from
// the int8 copy (q, scale, c1, c2) = int8_head_tiles(w); () where screened_columns does not apply.
std::vector<at::Tensor> screened_max(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor c1, at::Tensor c2,
                                     int64_t start, int64_t stop, at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && x.dim() == 2 && w.size(1) == x.size(1) &&
                  stop <= w.size(0), "w: the bfloat16 head [V, K] that (q, scale, c1, c2) copy");
  x = x.contiguous();
  const std::vector<at::Tensor> found = screened_columns(x, q, scale, c1, c2, start, stop);
  if (found.empty()) return {};
  const int64_t m_size = x.size(0), k_size = x.size(1), total = found[0].numel();
  const int64_t* cols = found[0].data_ptr<int64_t>();
  const int64_t* offsets = found[1].data_ptr<int64_t>();

  // every row's candidates in one call over their union, ascending
  std::vector<int64_t> all(cols, cols + total);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  const int64_t u_size = static_cast<int64_t>(all.size());
  at::Tensor picked;
  if (w.stride(1) == 1) {  // rows as they lie (a head is never copied whole for a few of them)
    picked = at::empty({u_size, k_size}, w.options());
    const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
    auto* pp = reinterpret_cast<uint16_t*>(picked.data_ptr());
    for (int64_t i = 0; i < u_size; ++i)
      std::memcpy(pp + i * k_size, wp + all[i] * w.stride(0), static_cast<size_t>(k_size) * sizeof(uint16_t));
  } else {
    picked = w.index_select(0, at::tensor(all, found[0].options())).contiguous();
  }
  const at::Tensor logits = rows_linear(x, picked).contiguous();
  const float* lp = logits.data_ptr<float>();

  auto values = at::empty({m_size}, logits.options());
  auto indices = at::empty({m_size}, found[0].options());
  float* vp = values.data_ptr<float>();
  int64_t* ip = indices.data_ptr<int64_t>();
  for (int64_t m = 0; m < m_size; ++m) {
    TORCH_CHECK(offsets[m] < offsets[m + 1], "a row without candidates");
    float best = 0.0f;
    int64_t best_col = -1;
    for (int64_t j = offsets[m]; j < offsets[m + 1]; ++j) {
      const int64_t at_u = std::lower_bound(all.begin(), all.end(), cols[j]) - all.begin();
      const float v = lp[m * u_size + at_u];
      if (std::isnan(v)) {  // the first NaN, as torch.argmax and rows_argmax
        best = v;
        best_col = cols[j];
        break;
      }
      if (best_col < 0 || v > best) {  // strictly: the first of equal maxima
        best = v;
        best_col = cols[j];
      }
    }
    vp[m] = best;
    ip[m] = best_col - start;
  }
  return {values, indices};
}
