// The argument checks of quant_linear, shared by its AVX2 and AVX512-VNNI builds (avx2_quant_linear.cpp,
// avx512_vnni_quant_linear.cpp), whose weight layouts differ only in their tile width.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace specdec_quant {

// x [M, K] (made contiguous float32 here) against the tiled weight's tensors for `kind` (0: s8, 1: u4) with
// `tile` output columns per tile and K in blocks of `block`; returns whether s8 sub-scales are given.
inline bool check_quant_args(at::Tensor& x, const at::Tensor& quants, const at::Tensor& scales, const at::Tensor& mins,
                             const at::Tensor& sub_scales, int64_t kind, int64_t tile, int64_t block) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "x [M, K] on the CPU");
  TORCH_CHECK(kind == 0 || kind == 1, "kind 0 (s8) or 1 (u4)");
  x = x.to(at::kFloat).contiguous();
  TORCH_CHECK(x.size(1) % block == 0, "K must be a multiple of 32");
  const int64_t blocks = x.size(1) / block, tiles = quants.size(0);
  TORCH_CHECK(quants.dim() == 5 && quants.size(1) == blocks && quants.size(2) == (kind == 0 ? 8 : 4) &&
              quants.size(3) == tile && quants.size(4) == 4 && quants.is_contiguous(), "quants layout");
  TORCH_CHECK(scales.is_contiguous() && mins.is_contiguous() && sub_scales.is_contiguous(), "contiguous");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == tiles * blocks * tile, "scales layout");
  const bool sub = kind == 0 && sub_scales.numel() > 0;
  if (sub)
    TORCH_CHECK(sub_scales.scalar_type() == at::kShort && sub_scales.numel() == tiles * blocks * tile * 2, "sub");
  if (kind == 1) TORCH_CHECK(mins.scalar_type() == at::kFloat && mins.numel() == tiles * blocks * tile, "mins");
  return sub;
}

}  // namespace specdec_quant
