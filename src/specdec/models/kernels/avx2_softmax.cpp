// Attention's softmax, float32 scores in, probabilities rounded to bfloat16 out (every build).
//
// Why our own: a row's float sum must not depend on how many columns the row is given. torch's softmax
// groups the terms of its sum by the row's length (its vector width and tail), so the attention kernel had
// to give every row a span fixed by its position alone, rounded up to 64 or 256 slots, and read and score
// those extra columns on every layer and step. Here column c (of a row whose first column is the cache slot
// `first`) always adds into lane (first + c) mod 16, and a masked column (-inf) adds exactly 0 to its lane,
// so any span that holds the row's visible columns gives the same bits: the spans can end at the row.
//
// The arithmetic of a row s of length L, first column f:
//   m = max of s (exact, any order);
//   e[c] = exp(s[c] - m) as avx2_exp.h computes it (exactly 0 for a masked column);
//   lane[l] = sum over c with (f + c) mod 16 = l, c ascending, of e[c], starting from +0;
//   S = the 16 lanes summed pairwise (8 = l + (l + 8), then 4, 2, 1), r = 1 / S;
//   p[c] = bf16(e[c] * r), round to nearest even (NaN stays NaN).
// The AVX512 and AVX2 forms compute exactly these steps.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "avx2_bf16.h"
#include "avx2_exp.h"

namespace {

using specdec_bf16::float_to_bf16;
using specdec_bf16::has_avx512;
using specdec_bf16::to_bf16x16;

constexpr int kLanes = 16;

// e[c] = exp(s[c] - m) for c in [0, len): 16 or 8 at a time, the last few through a padded copy
SPECDEC_AVX512 int64_t exps16(const float* s, int64_t len, float m, float* e) {
  const __m512 mv = _mm512_set1_ps(m);
  int64_t c = 0;
  for (; c + 16 <= len; c += 16) _mm512_storeu_ps(e + c, specdec_exp::exp16(_mm512_sub_ps(_mm512_loadu_ps(s + c), mv)));
  return c;
}

void exps(const float* s, int64_t len, float m, float* e) {
  int64_t c = has_avx512() ? exps16(s, len, m, e) : 0;
  const __m256 mv = _mm256_set1_ps(m);
  for (; c + 8 <= len; c += 8) _mm256_storeu_ps(e + c, specdec_exp::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), mv)));
  if (c < len) {
    alignas(32) float in[8], out[8];
    std::fill(in, in + 8, m);
    std::memcpy(in, s + c, (len - c) * sizeof(float));
    _mm256_store_ps(out, specdec_exp::exp8(_mm256_sub_ps(_mm256_load_ps(in), mv)));
    std::memcpy(e + c, out, (len - c) * sizeof(float));
  }
}

SPECDEC_AVX512 int64_t max16(const float* s, int64_t len, float* m, bool* nan) {
  __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 unordered = 0;
  int64_t c = 0;
  for (; c + 16 <= len; c += 16) {
    const __m512 v = _mm512_loadu_ps(s + c);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    mv = _mm512_max_ps(mv, v);
  }
  *m = _mm512_reduce_max_ps(mv);
  *nan = unordered != 0;
  return c;
}

// the row's maximum (exact in any order), or NaN where the row has one
float max_of(const float* s, int64_t len) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  const int64_t c0 = has_avx512() ? max16(s, len, &m, &nan) : 0;
  for (int64_t c = c0; c < len; ++c) nan = nan || std::isnan(s[c]), m = std::max(m, s[c]);
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// out[c] = bf16(e[c] * r) for the first 16 * (len / 16) columns; returns how many it wrote
SPECDEC_AVX512 int64_t scale16(const float* e, int64_t len, float r, uint16_t* out) {
  const __m512 rv = _mm512_set1_ps(r);
  int64_t c = 0;
  for (; c + 16 <= len; c += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), to_bf16x16(_mm512_mul_ps(_mm512_loadu_ps(e + c), rv)));
  return c;
}

// The lane sums: the unaligned head and the tail one float at a time, whole aligned groups of 16 as vectors
// (the same float adds per lane either way)
SPECDEC_AVX512 void add16(const float* e, int64_t groups, float* lane) {
  __m512 a = _mm512_loadu_ps(lane);
  for (int64_t g = 0; g < groups; ++g) a = _mm512_add_ps(a, _mm512_loadu_ps(e + g * kLanes));
  _mm512_storeu_ps(lane, a);
}

void add8x2(const float* e, int64_t groups, float* lane) {
  __m256 lo = _mm256_loadu_ps(lane), hi = _mm256_loadu_ps(lane + 8);
  for (int64_t g = 0; g < groups; ++g) {
    lo = _mm256_add_ps(lo, _mm256_loadu_ps(e + g * kLanes));
    hi = _mm256_add_ps(hi, _mm256_loadu_ps(e + g * kLanes + 8));
  }
  _mm256_storeu_ps(lane, lo);
  _mm256_storeu_ps(lane + 8, hi);
}

float lane_sum(const float* e, int64_t len, int64_t first) {
  alignas(64) float lane[kLanes] = {};
  const int64_t head = std::min<int64_t>(len, (kLanes - first % kLanes) % kLanes);
  for (int64_t c = 0; c < head; ++c) lane[(first + c) % kLanes] += e[c];
  const int64_t groups = (len - head) / kLanes;
  if (has_avx512()) add16(e + head, groups, lane);
  else add8x2(e + head, groups, lane);
  for (int64_t c = head + groups * kLanes; c < len; ++c) lane[(first + c) % kLanes] += e[c];
  return specdec_bf16::lane_total(lane);
}

}  // namespace

// One row as the header fixes it; `e` is scratch of len floats.
void softmax_row_bf16(const float* s, int64_t len, int64_t first, float* e, uint16_t* out) {
  if (len <= 0) return;
  exps(s, len, max_of(s, len), e);
  const float r = 1.0f / lane_sum(e, len, first);
  for (int64_t c = has_avx512() ? scale16(e, len, r, out) : 0; c < len; ++c) out[c] = float_to_bf16(e[c] * r);
}

// scores [..., L] float32 (last axis contiguous); column c of every row is cache slot first + c.
at::Tensor softmax_rows(at::Tensor scores, int64_t first) {
  TORCH_CHECK(scores.scalar_type() == at::kFloat && scores.dim() >= 1, "float32 scores [..., L]");
  TORCH_CHECK(first >= 0, "first must be a slot (>= 0)");
  const int64_t len = scores.size(-1);
  const at::Tensor rows = scores.reshape({-1, len}).contiguous();
  auto out = at::empty(scores.sizes(), scores.options().dtype(at::kBFloat16).memory_format(at::MemoryFormat::Contiguous));
  const int64_t n = rows.size(0);
  if (n == 0 || len == 0) return out;
  const float* sp = rows.data_ptr<float>();
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, n, std::max<int64_t>(1, (1 << 14) / len), [&](int64_t r0, int64_t r1) {
    std::vector<float> e(static_cast<size_t>(len));
    for (int64_t r = r0; r < r1; ++r) softmax_row_bf16(sp + r * len, len, first, e.data(), op + r * len);
  });
  return out;
}
