// act(gate) * up of a gated MLP in one pass, bfloat16 in and out (every build; AVX512 where the CPU has it).
//
// Why: in torch this is chunk, gelu (or silu) and a multiply, each writing a bfloat16 tensor that the next
// reads back. Over a 20-sequence batch's decode and prefill (Gemma 3 270M), torch's tanh-GELU alone was
// about 5% of the run and the multiply 2% more; here each value is read once and written once.
//
// The arithmetic of one output, fixed so that its bits depend on nothing but its gate g and up u (every
// row alone, whatever the batch):
//   GELU (tanh form) as g * sigmoid(2y): 0.5 g (1 + tanh y) is that identity, and it has no cancellation
//   for negative g;  y = sqrt(2 / pi) (g + 0.044715 g^3), z = -2y evaluated as ((g * g) * g) * 0.044715,
//   + g, * -1.5957691216;   SiLU: z = -g;
//   a = g / (1 + exp(z)),  out = bf16(a * u) (round to nearest even; one rounding where torch has two);
//   exp(z) as avx2_exp.h computes it.
// Every step is one IEEE float32 operation (the file builds with -ffp-contract=off), so the AVX512 and
// AVX2 loops give the same bits; tails run through the AVX2 loop on a zero-padded copy.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "avx2_bf16.h"
#include "avx2_exp.h"

namespace {

using specdec_bf16::has_avx512;
using specdec_bf16::to_bf16x16;
using specdec_bf16::to_bf16x8;
using specdec_bf16::load_bf16x16;
using specdec_bf16::load_bf16x8;
using specdec_exp::exp16;
using specdec_exp::exp8;

constexpr float kCube = 0.044715f, kMinus2Sqrt2OverPi = -1.5957691216f;
inline __m128i act8(const uint16_t* g, const uint16_t* u, bool gelu) {
  const __m256 gv = load_bf16x8(g);
  __m256 z;
  if (gelu) {
    z = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(gv, gv), gv), _mm256_set1_ps(kCube));
    z = _mm256_mul_ps(_mm256_add_ps(z, gv), _mm256_set1_ps(kMinus2Sqrt2OverPi));
  } else {
    z = _mm256_sub_ps(_mm256_setzero_ps(), gv);
  }
  const __m256 a = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(z)));
  return to_bf16x8(_mm256_mul_ps(a, load_bf16x8(u)));
}

SPECDEC_AVX512 inline __m256i act16(const uint16_t* g, const uint16_t* u, bool gelu) {
  const __m512 gv = load_bf16x16(g);
  __m512 z;
  if (gelu) {
    z = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(gv, gv), gv), _mm512_set1_ps(kCube));
    z = _mm512_mul_ps(_mm512_add_ps(z, gv), _mm512_set1_ps(kMinus2Sqrt2OverPi));
  } else {
    z = _mm512_sub_ps(_mm512_setzero_ps(), gv);
  }
  const __m512 a = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(z)));
  return to_bf16x16(_mm512_mul_ps(a, load_bf16x16(u)));
}

SPECDEC_AVX512 int64_t row16(const uint16_t* g, const uint16_t* u, int64_t n, bool gelu, uint16_t* y) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j), act16(g + j, u + j, gelu));
  return j;
}

void act_row(const uint16_t* g, const uint16_t* u, int64_t n, bool gelu, uint16_t* y) {
  int64_t j = has_avx512() ? row16(g, u, n, gelu, y) : 0;
  for (; j + 8 <= n; j += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + j), act8(g + j, u + j, gelu));
  if (j < n) {  // the last values through the same 8-lane arithmetic, zero-padded
    alignas(32) uint16_t gt[8] = {}, ut[8] = {}, yt[8];
    std::memcpy(gt, g + j, (n - j) * 2);
    std::memcpy(ut, u + j, (n - j) * 2);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(yt), act8(gt, ut, gelu));
    std::memcpy(y + j, yt, (n - j) * 2);
  }
}

}  // namespace

// gate_up [..., 2 I] bfloat16 (gate = the first I values, up = the last I; last axis contiguous) ->
// act(gate) * up [..., I] bfloat16, contiguous; act is the tanh-form GELU (gelu) or SiLU.
at::Tensor gated_act_mul(at::Tensor gate_up, bool gelu) {
  TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16, "bfloat16 gate_up only");
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "gate_up's last axis must be even (gate, up)");
  const int64_t n = gate_up.size(-1) / 2;
  at::Tensor rows = gate_up.reshape({-1, 2 * n});
  if (rows.stride(-1) != 1) rows = rows.contiguous();
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = n;
  auto y = at::empty(shape, gate_up.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t m = rows.size(0), stride = rows.stride(0);
  if (m == 0 || n == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(rows.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / n);
  at::parallel_for(0, m, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) act_row(xp + r * stride, xp + r * stride + n, n, gelu, yp + r * n);
  });
  return y;
}
