// exp(z) for float32 vectors, shared by the kernels that need it (avx2_gated_act.cpp, avx2_softmax.cpp).
//
// Why our own: torch's exp (Sleef) is not callable from here, and a kernel's bits must not depend on the ISA.
// The arithmetic, one IEEE float32 operation per step (the files build with -ffp-contract=off), the same in
// the 8-lane (AVX2) and 16-lane (AVX512) forms:
//   z < -87 gives exactly 0 (so a masked -inf score gives a 0 probability); NaN stays NaN;
//   z is clamped to at most 89 (from about 88.4 the result is inf);
//   n = round(z log2 e) to nearest even, r = (z - n C1) - n C2 (Cody-Waite split of ln 2),
//   p = ((((((P0 r + P1) r + P2) r + P3) r + P4) r + P5) (r r) + r) + 1 (Cephes' expf polynomial),
//   exp(z) = p * 2^n, 2^n made in the exponent bits.
// Within 2 float32 ulps of exp over the range.
#pragma once

#include <immintrin.h>

#include "avx2_bf16.h"

namespace specdec_exp {

constexpr float kLog2e = 1.44269504088896341f, kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
constexpr float kLow = -87.0f, kHigh = 89.0f;

inline __m256 exp8(__m256 z) {
  const __m256 under = _mm256_cmp_ps(z, _mm256_set1_ps(kLow), _CMP_LT_OQ);
  z = _mm256_min_ps(_mm256_set1_ps(kHigh), _mm256_max_ps(_mm256_set1_ps(kLow), z));  // NaN passes through
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(z, _mm256_mul_ps(n, _mm256_set1_ps(kC1)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kC2)));
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP1));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP2));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP3));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP4));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP5));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

SPECDEC_AVX512 inline __m512 exp16(__m512 z) {
  const __mmask16 under = _mm512_cmp_ps_mask(z, _mm512_set1_ps(kLow), _CMP_LT_OQ);
  z = _mm512_min_ps(_mm512_set1_ps(kHigh), _mm512_max_ps(_mm512_set1_ps(kLow), z));  // NaN passes through
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(z, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(z, _mm512_mul_ps(n, _mm512_set1_ps(kC1)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(kC2)));
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kP1));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kP2));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kP3));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kP4));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kP5));
  p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~under), _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

}  // namespace specdec_exp
