// RMSNorm of bfloat16 rows in one call, bfloat16 out (every build; AVX2, AVX512 where the CPU has it).
//
// Why: decoder.rms_norm in torch is eight small ops (upcast, square, mean, add, rsqrt, two multiplies, the
// cast back); a Gemma 3 layer runs five norms, so a batched decode step spent about a fifth of its time in
// their dispatch. Here one call does a whole norm.
//
// The arithmetic of a row x of D values (fixed, so a row's bits depend on nothing but the row and its scale):
//   lanes: acc[l] = sum over k = l, l + 16, l + 32, ... (ascending) of x[k] * x[k] (exact: bfloat16 squares
//          fit float32), then the 16 lanes summed pairwise: 8 = l + (l + 8), 4, 2, 1;
//   r = 1 / sqrt(sum / D + eps), each step rounded to float32;
//   Gemma (`gemma`, scale float32 = 1 + w): y[k] = bf16(x[k] * r * scale[k]);
//   Llama family (scale bfloat16 = w):       y[k] = bf16(scale[k] * bf16(x[k] * r)).
// The AVX512 and AVX2 loops (16 lanes as two registers) and the scalar tail compute exactly these sums, so
// every ISA gives the same bits. It is not torch's reduction order (its mean groups terms by its vector
// width), so values differ from F.rms_norm by float32 rounding only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "avx2_bf16.h"

namespace {

using specdec_bf16::bf16_to_float;
using specdec_bf16::float_to_bf16;
using specdec_bf16::has_avx512;
using specdec_bf16::lane_total;
using specdec_bf16::to_bf16x16;
using specdec_bf16::load_bf16x16;
using specdec_bf16::load_bf16x8;

constexpr int kLanes = 16;


SPECDEC_AVX512 int64_t squares16(const uint16_t* x, int64_t d, float* acc) {
  __m512 a = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + kLanes <= d; k += kLanes) {
    const __m512 v = load_bf16x16(x + k);
    a = _mm512_add_ps(a, _mm512_mul_ps(v, v));
  }
  _mm512_storeu_ps(acc, a);
  return k;
}

int64_t squares8x2(const uint16_t* x, int64_t d, float* acc) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kLanes <= d; k += kLanes) {
    const __m256 a = load_bf16x8(x + k), b = load_bf16x8(x + k + 8);
    lo = _mm256_add_ps(lo, _mm256_mul_ps(a, a));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(b, b));
  }
  _mm256_storeu_ps(acc, lo);
  _mm256_storeu_ps(acc + 8, hi);
  return k;
}

// The output steps of norm_row for the first 16 * (d / 16) values; returns how many it wrote.
SPECDEC_AVX512 int64_t scale16(const uint16_t* x, int64_t d, float r, const float* fscale, const uint16_t* bscale,
                               uint16_t* y) {
  const __m512 rv = _mm512_set1_ps(r);
  int64_t j = 0;
  for (; j + 16 <= d; j += 16) {
    const __m512 h = _mm512_mul_ps(load_bf16x16(x + j), rv);
    __m256i out;
    if (fscale) {
      out = to_bf16x16(_mm512_mul_ps(h, _mm512_loadu_ps(fscale + j)));
    } else {
      const __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16x16(h)), 16));
      out = to_bf16x16(_mm512_mul_ps(load_bf16x16(bscale + j), hb));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j), out);
  }
  return j;
}

void norm_row(const uint16_t* x, int64_t d, const float* fscale, const uint16_t* bscale, float eps, float fd,
              uint16_t* y) {
  alignas(64) float acc[kLanes];
  int64_t k = has_avx512() ? squares16(x, d, acc) : squares8x2(x, d, acc);
  for (; k < d; ++k) {  // the tail joins its lanes in the same order
    const float v = bf16_to_float(x[k]);
    acc[k % kLanes] += v * v;
  }
  const float mean = lane_total(acc) / fd;
  const float r = 1.0f / std::sqrt(mean + eps);
  const int64_t done = has_avx512() ? scale16(x, d, r, fscale, bscale, y) : 0;
  if (fscale) {
    for (int64_t j = done; j < d; ++j) y[j] = float_to_bf16(bf16_to_float(x[j]) * r * fscale[j]);
  } else {
    for (int64_t j = done; j < d; ++j)
      y[j] = float_to_bf16(bf16_to_float(bscale[j]) * bf16_to_float(float_to_bf16(bf16_to_float(x[j]) * r)));
  }
}

}  // namespace

// x [..., G, D] or [..., D] bfloat16 (last axis contiguous, any strides before it); scale [G, D] or [D]:
// float32 (gemma) or bfloat16; row i of a group axis reads scale row i. Returns a contiguous bfloat16 tensor
// of x's shape.
at::Tensor rms_norm_rows(at::Tensor x, at::Tensor scale, double eps, bool gemma) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "bfloat16 x only");
  TORCH_CHECK(scale.scalar_type() == (gemma ? at::kFloat : at::kBFloat16),
              gemma ? "a Gemma norm's scale is float32 (1 + w)" : "the scale is bfloat16 (w)");
  TORCH_CHECK(x.dim() >= 1 && x.stride(-1) == 1, "x's last axis must be contiguous");
  const int64_t d = x.size(-1);
  TORCH_CHECK(scale.size(-1) == d && scale.dim() <= 2, "scale [D] or [G, D]");
  const int64_t groups = scale.dim() == 2 ? scale.size(0) : 1;
  TORCH_CHECK(groups == 1 || (x.dim() >= 2 && x.size(-2) == groups), "scale [G, D] needs x [..., G, D]");
  scale = scale.contiguous();
  // rows as (outer, group): the group axis may be strided differently from the outer ones (a slice of qkv)
  at::Tensor xv = groups == 1 ? x.reshape({-1, 1, d}) : x.reshape({-1, groups, d});
  auto y = at::empty(x.sizes(), x.options());
  const int64_t outer = xv.size(0), s0 = xv.stride(0), s1 = xv.stride(1);
  const auto* xp = reinterpret_cast<const uint16_t*>(xv.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const float* fs = gemma ? scale.data_ptr<float>() : nullptr;
  const auto* bs = gemma ? nullptr : reinterpret_cast<const uint16_t*>(scale.data_ptr<at::BFloat16>());
  const float feps = static_cast<float>(eps), fd = static_cast<float>(d);
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (d * groups));
  at::parallel_for(0, outer, grain, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t g = 0; g < groups; ++g)
        norm_row(xp + o * s0 + g * s1, d, fs ? fs + g * d : nullptr, bs ? bs + g * d : nullptr, feps, fd,
                 yp + (o * groups + g) * d);
  });
  return y;
}
