// The argument checks of quant_linear, shared by its AVX2 and AVX512-VNNI builds (avx2_quant_linear.cpp,
// avx512_vnni_quant_linear.cpp), whose weight layouts differ only in their tile width.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "avx2_bf16.h"

namespace specdec_quant {

// x [M, K] float32 or bfloat16 (made contiguous here) against the tiled weight's tensors for `kind` (0: s8, 1: u4) with
// `tile` output columns per tile and K in blocks of `block`; returns whether s8 sub-scales are given. Scales are
// float32 or float16 (GGUF's own fp16 scales, read exactly: 2 bytes a block less), u4's mins the same type;
// kind 2 is s5 (s8 quants in -16..15 as nibbles and a bit plane).
inline bool check_quant_args(at::Tensor& x, const at::Tensor& quants, const at::Tensor& scales, const at::Tensor& mins,
                             const at::Tensor& sub_scales, int64_t kind, int64_t tile, int64_t block) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "x [M, K] on the CPU");
  TORCH_CHECK(kind == 0 || kind == 1 || kind == 2, "kind 0 (s8), 1 (u4) or 2 (s5)");
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) x = x.to(at::kFloat);  // read as is
  if (!x.is_contiguous()) x = x.contiguous();
  TORCH_CHECK(x.size(1) % block == 0, "K must be a multiple of 32");
  const int64_t blocks = x.size(1) / block, tiles = quants.size(0);
  TORCH_CHECK(quants.dim() == 5 && quants.size(1) == blocks && quants.size(2) == (kind == 0 ? 8 : kind == 1 ? 4 : 5) &&
              quants.size(3) == tile && quants.size(4) == 4 && quants.is_contiguous(), "quants layout");
  TORCH_CHECK(scales.is_contiguous() && mins.is_contiguous() && sub_scales.is_contiguous(), "contiguous");
  TORCH_CHECK((scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf) &&
              scales.numel() == tiles * blocks * tile, "scales layout");
  const bool sub = kind == 0 && sub_scales.numel() > 0;
  if (sub)
    TORCH_CHECK(sub_scales.scalar_type() == at::kShort && sub_scales.numel() == tiles * blocks * tile * 2, "sub");
  if (kind == 1)
    TORCH_CHECK(mins.scalar_type() == scales.scalar_type() && mins.numel() == tiles * blocks * tile, "mins");
  return sub;
}

// Whether a block of x is all finite. A NaN or an infinity has no int8 value (the reference's products are
// NaN); quantize_rows gives such a block a NaN scale (kNaN) and zero quants, so every output of its row is
// NaN as in the reference, where the integer conversion alone would drop it silently.
inline bool block_finite(const float* xb, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(xb[i])) return false;
  return true;
}
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// x's rows as float32: its own data when it is float32, else converted into `scratch` (exact: bfloat16 is a
// float32 with the low 16 bits zero), without a torch op per call.
inline const float* float_rows(const at::Tensor& x, std::vector<float>& scratch) {
  if (x.scalar_type() == at::kFloat) return x.data_ptr<float>();
  const auto* h = static_cast<const uint16_t*>(x.data_ptr());
  scratch.resize(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) scratch[i] = specdec_bf16::bf16_to_float(h[i]);
  return scratch.data();
}

// quant_linear's result [M, N]: float32, or bfloat16 rounded as c10::BFloat16 rounds the float32 (the
// decoder's dtype, without a second torch op and pass over y). A tile's columns are stored as they finish.
struct OutputRows {
  at::Tensor y;
  float* f = nullptr;
  uint16_t* h = nullptr;
  int64_t ld = 0;

  OutputRows(const at::Tensor& x, int64_t n_size, bool bf16)
      : y(at::empty({x.size(0), n_size}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat))), ld(n_size) {
    if (bf16)
      h = static_cast<uint16_t*>(y.data_ptr());
    else
      f = y.data_ptr<float>();
  }

  // n float32 values of `row`, from column `col`
  void store(int64_t row, int64_t col, const float* v, int64_t n) const {
    if (f != nullptr) {
      std::memcpy(f + row * ld + col, v, sizeof(float) * n);
      return;
    }
    uint16_t* out = h + row * ld + col;
    for (int64_t i = 0; i < n; ++i) out[i] = specdec_bf16::float_to_bf16(v[i]);
  }
};

}  // namespace specdec_quant
