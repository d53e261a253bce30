// y = x @ w.T for bfloat16 rows and a dense bfloat16 weight, on CPUs with AVX512-BF16: the bits of
// packed_rows_linear(x, pack_bf16_panels(w)) (bf16_packed_linear.cpp), so a weight gives the same outputs with
// its packed copy (fast_linear.pack_weight) and without. Each thread packs C panels of w at a time into a
// buffer of its own (bf16_panels.h: 64 shuffles per 16 x 16 pairs, which a one-row call hides under the
// weight's read) and runs the panels' code on it. Output is float32; no row depends on how many rows share
// the call, the threads or the blocking.
//
// Built with avx2_module.cpp and the AVX2 attention files (whose flags are AVX2's): the target pragma
// enables AVX512-BF16 for this file only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

#include "bf16_panels.h"

using specdec_bf16_panels::kLanes;
using specdec_bf16_panels::kPairWidth;

at::Tensor rows_linear(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K]");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t m_size = x.size(0), k_size = x.size(1), n_size = w.size(0);
  auto y = at::empty({m_size, n_size}, x.options().dtype(at::kFloat));
  if (m_size == 0 || n_size == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  const int64_t pairs = (k_size + 1) / 2, panel = pairs * kPairWidth;
  const int64_t panels = (n_size + kLanes - 1) / kLanes;
  constexpr int C = 4;  // as packed_rows_linear groups them (any grouping gives the same bits)
  const int64_t groups = (panels + C - 1) / C;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<uint16_t> buffer(static_cast<size_t>(C * panel));
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t b = g * C, count = std::min<int64_t>(C, panels - b);
      __mmask16 mask[C];
      for (int c = 0; c < C; ++c) {
        const int64_t valid = c < count ? std::min<int64_t>(kLanes, n_size - (b + c) * kLanes) : 0;
        mask[c] = static_cast<__mmask16>((1u << valid) - 1);
        if (valid > 0)
          specdec_bf16_panels::pack_panel(wp + (b + c) * kLanes * k_size, k_size, k_size, valid,
                                          buffer.data() + c * panel);
      }
      specdec_bf16_panels::group<C>(xp, m_size, k_size, buffer.data(), pairs, panel, count, yp + b * kLanes, n_size,
                                    mask);
    }
  }
  return y;
}

#pragma GCC pop_options
