// Rotary position embedding of bfloat16 rows in one call: decoder.apply_rope's x * cos + roll(x, D/2) * sin
// with torch's bfloat16 rounding after each of the three ops, so the same bits as those ops.
//
// Why: apply_rope is four small torch ops per layer (two multiplies, a roll, an add), each a dispatch and a
// pass over q and k; at a batch's decode step they were about 2% of the step, for a few thousand values.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "avx2_bf16.h"

namespace {

using specdec_bf16::bf16_to_float;
using specdec_bf16::float_to_bf16;
using specdec_bf16::has_avx512;
using specdec_bf16::to_bf16x16;
using specdec_bf16::load_bf16x16;

inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

SPECDEC_AVX512 inline __m512 widen(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// One row of D values; returns how many it wrote (all of them, in 16s, when D / 2 is a multiple of 16).
SPECDEC_AVX512 int64_t rope16(const uint16_t* x, const uint16_t* c, const uint16_t* s, int64_t d, uint16_t* y) {
  const int64_t half = d / 2;
  if (half % 16) return 0;
  for (int64_t j = 0; j < d; j += 16) {
    const int64_t k = j < half ? j + half : j - half;
    const __m512 a = widen(to_bf16x16(_mm512_mul_ps(load_bf16x16(x + j), load_bf16x16(c + j))));
    const __m512 b = widen(to_bf16x16(_mm512_mul_ps(load_bf16x16(x + k), load_bf16x16(s + j))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j), to_bf16x16(_mm512_add_ps(a, b)));
  }
  return d;
}

void rope_row(const uint16_t* x, const uint16_t* c, const uint16_t* s, int64_t d, uint16_t* y) {
  if (has_avx512() && rope16(x, c, s, d, y) == d) return;
  const int64_t half = d / 2;
  for (int64_t j = 0; j < d; ++j) {
    const int64_t k = j < half ? j + half : j - half;
    const float a = round_bf16(bf16_to_float(x[j]) * bf16_to_float(c[j]));
    const float b = round_bf16(bf16_to_float(x[k]) * bf16_to_float(s[j]));
    y[j] = float_to_bf16(a + b);
  }
}

}  // namespace

// x [T, G, D] bfloat16 (last axis contiguous, any strides before it), cos and signed_sin [T, 1, D] or [T, D]
// bfloat16 (decoder.RopeTable's rows for each token's position) -> contiguous [T, G, D]:
// bf16(bf16(x * cos) + bf16(roll(x, D / 2) * signed_sin)), as decoder.apply_rope's torch ops give it.
at::Tensor rope_rows(at::Tensor x, at::Tensor cos, at::Tensor sin) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && cos.scalar_type() == at::kBFloat16 &&
                  sin.scalar_type() == at::kBFloat16, "bfloat16 x, cos and sin");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "x [T, G, D] with its last axis contiguous");
  const int64_t t = x.size(0), g = x.size(1), d = x.size(2);
  TORCH_CHECK(d % 2 == 0, "an even head dimension");
  const at::Tensor cs = cos.reshape({-1, d}).contiguous(), sn = sin.reshape({-1, d}).contiguous();
  TORCH_CHECK(cs.size(0) == t && sn.size(0) == t, "one cos and sin row per token");
  auto y = at::empty({t, g, d}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* cp = reinterpret_cast<const uint16_t*>(cs.data_ptr<at::BFloat16>());
  const auto* sp = reinterpret_cast<const uint16_t*>(sn.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  at::parallel_for(0, t, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, g * d)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t h = 0; h < g; ++h) rope_row(xp + r * s0 + h * s1, cp + r * d, sp + r * d, d, yp + (r * g + h) * d);
  });
  return y;
}
