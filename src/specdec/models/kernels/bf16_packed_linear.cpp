// y = x @ w.T for bfloat16 rows against a weight packed once in 16-column panels (bf16_panels.h), on CPUs with
// AVX512-BF16: the layers' packed copies (fast_linear.pack_weight) and the LM head (packed_head.py), with the
// bits of bf16_rows_linear.cpp's rows_linear on the dense weight, which packs its panels as it goes.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

#include "bf16_panels.h"

using specdec_bf16_panels::kLanes;
using specdec_bf16_panels::kPairWidth;

// w [N, K] bfloat16 -> [ceil(N / 16), ceil(K / 2), 32] bfloat16: panel b, pair p holds columns 16b..16b+15's
// values k = 2p, 2p + 1 (zeros past N and K).
at::Tensor pack_bf16_panels(at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2, "bfloat16 w [N, K]");
  w = w.contiguous();
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kLanes - 1) / kLanes, pairs = (k + 1) / 2;
  auto out = at::empty({panels, pairs, kPairWidth}, w.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, panels, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      specdec_bf16_panels::pack_panel(src + b * kLanes * k, k, k, std::min<int64_t>(kLanes, n - b * kLanes),
                                      dst + b * pairs * kPairWidth);
  });
  return out;
}

// float32 x [M, K] @ w.T over the output columns [start, stop) of a packed w (pack_bf16_panels of [N, K]).
at::Tensor packed_rows_linear(at::Tensor x, at::Tensor packed, int64_t n_size, int64_t start, int64_t stop) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == kPairWidth, "x [M, K], packed [P, K/2, 32]");
  TORCH_CHECK(packed.size(1) == (x.size(1) + 1) / 2 && packed.size(0) == (n_size + kLanes - 1) / kLanes,
              "packed panels do not match x's K or N: pack_bf16_panels");
  TORCH_CHECK(0 <= start && start <= stop && stop <= n_size, "columns outside [0, N)");
  x = x.contiguous();
  packed = packed.contiguous();
  const int64_t m_size = x.size(0), k_size = x.size(1), pairs = packed.size(1), width = stop - start;
  auto y = at::empty({m_size, width}, x.options().dtype(at::kFloat));
  if (m_size == 0 || width == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  const int64_t panel = pairs * kPairWidth;
  const int64_t first = start / kLanes, last = (stop + kLanes - 1) / kLanes;  // panels [first, last)
  constexpr int C = 4;
  const int64_t groups = (last - first + C - 1) / C;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t b = first + g * C, count = std::min<int64_t>(C, last - b);
    __mmask16 mask[C];
    for (int c = 0; c < C; ++c) mask[c] = c < count ? specdec_bf16_panels::columns_mask(b + c, start, stop) : 0;
    // column b * 16 of y's row 0 (masked lanes before `start` are never stored)
    float* out = yp + (b * kLanes - start);
    specdec_bf16_panels::group<C>(xp, m_size, k_size, wp + b * panel, pairs, panel, count, out, width, mask);
  }
  return y;
}

#pragma GCC pop_options

namespace {

// packed_rows_linear with the quantized module's quant_linear signature (layer_linear.h), for the one-call
// layers: `packed` the weight's panels, `n_size` its output features; the three tensors between them unused.
at::Tensor bf16_packed_layer_linear(at::Tensor x, at::Tensor packed, at::Tensor, at::Tensor, at::Tensor,
                                    int64_t n_size, bool bf16_out) {
  at::Tensor y = packed_rows_linear(std::move(x), std::move(packed), n_size, 0, n_size);
  return bf16_out ? y.to(at::kBFloat16) : y;
}

}  // namespace

int64_t bf16_packed_layer_linear_address() { return reinterpret_cast<int64_t>(&bf16_packed_layer_linear); }
