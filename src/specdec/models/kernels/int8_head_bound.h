// The int8 copy of a bfloat16 LM head and the bound that lets it rule columns out, shared by the greedy head's
// screens (amx_screened_argmax.cpp on AMX-INT8, avx2_screened_columns.cpp elsewhere).
//
// For column j and row h. At packing, w_j ~ s_j q_j with q_j int8 and d_j = max |w_j - s_j q_j|. Per call,
// h ~ s_h (a + b / 254) with a, b int8 (two passes: hidden rows have outliers, and one int8 would leave each
// element up to s_h / 2 off) and e_h = max |h - s_h (a + b / 254)|. The dots a . q_j and b . q_j are exact
// int32, and
//   |h . w_j - s_j s_h (a . q_j + b . q_j / 254)| <= |h|_1 d_j + e_h s_j |q_j|_1,
// plus (K + 32) float32 roundings of |h|_1 max |w_j| for the head's own float32 accumulation (any order of
// its K exact products) and the estimate's arithmetic. A column whose upper bound is below the best lower
// bound of its row cannot be that row's maximum. The AVX2 screen takes one int16 pass instead,
// h ~ s_h c (row_int16), and the same bound with e_h = max |h - s_h c|.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "avx2_bf16.h"

namespace specdec_screen {

constexpr double kRound = 5.9604644775390625e-08;  // 2^-24: a float32 rounding
constexpr double kSlack = 1.0 + 1e-5;  // the per-row factors rounded up
// Denormal products and sums flushed to zero by a kernel: far below any logit a bound separates.
constexpr float kTiny = 1e-30f;
// Weights larger than this are not screened: with |h|_1 <= 1e30 no logit can then overflow float32.
constexpr double kLargestWeight = 1e6;
// Rows with |h|_1 above this (or a non-finite value) go to the exact head unscreened.
constexpr double kLargestRowL1 = 1e30;

// Column j of the head (K bfloat16 `row`) as int8 quants q[k * stride] with its factors: s_j, c1 = d_j +
// (K + 32) roundings of max |w_j|, c2 = s_j |q_j|_1, the bounds rounded up. False (nothing written) for a non-finite
// weight or one above kLargestWeight.
inline bool column_copy(const uint16_t* row, int64_t k_size, int8_t* q, int64_t stride, float& s_out, float& c1,
                        float& c2) {
  double top = 0.0;
  for (int64_t k = 0; k < k_size; ++k)
    top = std::max(top, std::fabs(static_cast<double>(specdec_bf16::bf16_to_float(row[k]))));
  if (!std::isfinite(top) || top > kLargestWeight) return false;
  const float s = static_cast<float>(top / 127.0);
  double d = 0.0, sum = 0.0;
  for (int64_t k = 0; k < k_size; ++k) {
    const double x = specdec_bf16::bf16_to_float(row[k]);
    const double qk = s > 0 ? std::clamp(std::nearbyint(x / s), -127.0, 127.0) : 0.0;
    q[k * stride] = static_cast<int8_t>(qk);
    d = std::max(d, std::fabs(x - static_cast<double>(s) * qk));
    sum += std::fabs(qk);
  }
  s_out = s;
  c1 = static_cast<float>((d + (k_size + 32) * kRound * top) * kSlack);
  c2 = static_cast<float>(static_cast<double>(s) * sum * kSlack);
  return true;
}

// One row's factors of the estimate and its bound: alpha = s_h, beta = s_h / 254 (0 for one int16 pass),
// l1 = |h|_1, err = e_h (rounded up).
struct RowFactor {
  float alpha = 0.0f, beta = 0.0f, l1 = 0.0f, err = 0.0f;
};

// Row h's largest |h[k]| and |h|_1; false for a non-finite row or one with |h|_1 above kLargestRowL1 (the
// exact head decides it).
inline bool row_size(const uint16_t* row, int64_t k_size, double& top, double& l1) {
  top = 0.0;
  l1 = 0.0;
  for (int64_t k = 0; k < k_size; ++k) {
    const double h = std::fabs(static_cast<double>(specdec_bf16::bf16_to_float(row[k])));
    top = std::max(top, h);
    l1 += h;
  }
  return std::isfinite(l1) && l1 <= kLargestRowL1;
}

// Row h (K bfloat16) as its two int8 passes a[k], b[k] and its factors; false for a non-finite row or one
// with |h|_1 above kLargestRowL1 (the exact head decides it; a and b are then unwritten).
inline bool row_passes(const uint16_t* row, int64_t k_size, int8_t* a, int8_t* b, RowFactor& f) {
  double top, l1;
  if (!row_size(row, k_size, top, l1)) return false;
  const double s = top / 127.0;
  double err = 0.0;
  for (int64_t k = 0; k < k_size && s > 0; ++k) {
    const double h = specdec_bf16::bf16_to_float(row[k]);
    const double hi = std::clamp(std::nearbyint(h / s), -127.0, 127.0);
    const double lo = std::clamp(std::nearbyint((h / s - hi) * 254.0), -127.0, 127.0);
    a[k] = static_cast<int8_t>(hi);
    b[k] = static_cast<int8_t>(lo);
    err = std::max(err, std::fabs(h - s * (hi + lo / 254.0)));
  }
  f.alpha = static_cast<float>(s);
  f.beta = static_cast<float>(s / 254.0);
  f.l1 = static_cast<float>(l1 * kSlack);
  f.err = static_cast<float>(err * kSlack);
  return true;
}

// Row h (K bfloat16) as one int16 pass c[k] ~ h[k] / s_h (the AVX2 screen's integer products take 16-bit
// activations), with f.alpha = s_h, f.beta = 0, l1 and err = e_h = max |h - s_h c|. s_h is top / 32767,
// or larger where 127 |c|_1 could overflow the int32 sums (a row without outliers): then
// 127 |c|_1 <= 127 (|h|_1 / s_h + K / 2) <= 2^31 - 1. False for a non-finite row or one with |h|_1 above
// kLargestRowL1.
inline bool row_int16(const uint16_t* row, int64_t k_size, int16_t* c, RowFactor& f) {
  double top, l1;
  if (!row_size(row, k_size, top, l1)) return false;
  // |h|_1 / s_h may reach this; rounding each element adds up to K / 2 more, still below 2^31 / 127
  const double room = 2147483647.0 / 127.0 - static_cast<double>(k_size);
  if (room <= 0) return false;
  const double s = static_cast<float>(std::max(top / 32767.0, l1 / room));  // the alpha the estimate uses
  double err = 0.0, sum = 0.0;
  for (int64_t k = 0; k < k_size; ++k) {
    const double h = specdec_bf16::bf16_to_float(row[k]);
    const double ck = s > 0 ? std::clamp(std::nearbyint(h / s), -32767.0, 32767.0) : 0.0;
    c[k] = static_cast<int16_t>(ck);
    err = std::max(err, std::fabs(h - s * ck));
    sum += std::fabs(ck);
  }
  if (127.0 * sum > 2147483647.0) return false;  // cannot happen with s as chosen; kept as the proof's check
  f.alpha = static_cast<float>(s);
  f.beta = 0.0f;
  f.l1 = static_cast<float>(l1 * kSlack);
  f.err = static_cast<float>(err * kSlack);
  return true;
}

}  // namespace specdec_screen
