// The AVX512-BF16 build's one form of a bfloat16 linear: the weight in 16-column panels of k pairs, each output
// column one float32 lane accumulated by VDPBF16PS in ascending pairs (the x pair broadcast against the 16
// columns' pairs). bf16_packed_linear.cpp runs it on panels packed once (pack_bf16_panels: the layers' packed
// copies and the LM head); bf16_rows_linear.cpp packs a dense weight's panels as it goes, into a buffer the
// same code then reads, so both give the same bits. Every output is the same chain whatever the number of
// rows, the blocking or the threads: no row depends on M.
//
// Why this form (rather than a dot product per output summed across lanes at the end): on a 2-core Zen 4, the
// 72 linears of one Gemma 3 270M decode step took 7.9 / 6.0 / 7.1 / 12.2 / 256 ms at 1 / 4 / 8 / 16 / 512 rows
// on packed panels against 10.2 / 12.2 / 13.7 / 18.8 / 322 ms with the per-output dot products (no lane sums,
// no scattered stores).
//
// Include after `#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")`.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace specdec_bf16_panels {

constexpr int64_t kLanes = 16;  // output columns per panel
constexpr int64_t kPairWidth = 2 * kLanes;  // bfloat16 values per pair row of a panel

// 16 rows of 16 dwords in, r[p] = dword p of each row (row c in lane c) out: 64 shuffles.
inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int a = 0; a < 8; ++a) {  // per 128-bit lane L: (r2a[4L], r2a+1[4L], r2a[4L+1], r2a+1[4L+1]), then +2
    t[2 * a] = _mm512_unpacklo_epi32(r[2 * a], r[2 * a + 1]);
    t[2 * a + 1] = _mm512_unpackhi_epi32(r[2 * a], r[2 * a + 1]);
  }
  __m512i u[16];
  for (int b = 0; b < 4; ++b) {  // u[4b + q] lane L: rows 4b..4b+3 at dword 4L + q
    u[4 * b] = _mm512_unpacklo_epi64(t[4 * b], t[4 * b + 2]);
    u[4 * b + 1] = _mm512_unpackhi_epi64(t[4 * b], t[4 * b + 2]);
    u[4 * b + 2] = _mm512_unpacklo_epi64(t[4 * b + 1], t[4 * b + 3]);
    u[4 * b + 3] = _mm512_unpackhi_epi64(t[4 * b + 1], t[4 * b + 3]);
  }
  for (int q = 0; q < 4; ++q) {  // r[4L + q] lane b = u[4b + q] lane L: a 4 x 4 transpose of 128-bit lanes
    const __m512i v0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x44), v1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xEE);
    r[q] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + q] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + q] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// One panel: `valid` (<= 16) rows of a dense weight, k_size bfloat16 each, `stride` apart, into dst
// [ceil(k_size / 2)][32] (pair p: column c's values k = 2p, 2p + 1 at 2c, 2c + 1), zeros past `valid` and K.
inline void pack_panel(const uint16_t* w, int64_t stride, int64_t k_size, int64_t valid, uint16_t* dst) {
  const int64_t pairs = (k_size + 1) / 2;
  for (int64_t p0 = 0; p0 < pairs; p0 += kLanes) {
    const int64_t k0 = 2 * p0, left = std::min<int64_t>(kPairWidth, k_size - k0);
    const __mmask32 mask = left >= kPairWidth ? ~__mmask32(0) : static_cast<__mmask32>((1u << left) - 1);
    __m512i r[16];
    if (valid == kLanes && left == kPairWidth) {
      for (int c = 0; c < 16; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(w + c * stride + k0 + 4 * kPairWidth), _MM_HINT_T0);
        r[c] = _mm512_loadu_si512(w + c * stride + k0);
      }
    } else {
      for (int c = 0; c < 16; ++c)
        r[c] = c < valid ? _mm512_maskz_loadu_epi16(mask, w + c * stride + k0) : _mm512_setzero_si512();
    }
    transpose16(r);
    const int64_t count = std::min<int64_t>(kLanes, pairs - p0);
    for (int64_t p = 0; p < count; ++p) _mm512_storeu_si512(dst + (p0 + p) * kPairWidth, r[p]);
  }
}

// R rows of x (stride k_size, bf16) against C panels (each pairs * 32 bf16, consecutive panels `panel`
// apart); y rows stride ldy; `mask[c]` the columns of panel c to store.
template <int R, int C>
inline void block(const uint16_t* x, int64_t k_size, const uint16_t* w, int64_t pairs, int64_t panel, float* y,
                  int64_t ldy, const __mmask16* mask) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh wv[C];
    for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * panel + p * kPairWidth);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      if (2 * p + 1 < k_size) {
        std::memcpy(&pair, x + r * k_size + 2 * p, 4);
      } else {  // odd K: the last pair's second value is zero (as its packed weight)
        pair = static_cast<int32_t>(x[r * k_size + 2 * p]);
      }
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(y + r * ldy + c * kLanes, mask[c], acc[r][c]);
}

// Every row of x against C panels, in row blocks that fit the registers.
template <int C>
inline void rows(const uint16_t* x, int64_t m_size, int64_t k_size, const uint16_t* w, int64_t pairs,
                 int64_t panel, float* y, int64_t ldy, const __mmask16* mask) {
  constexpr int RM = C >= 8 ? 2 : 6;  // accumulators + weights + broadcast within 32 registers
  int64_t m = 0;
  for (; m + RM <= m_size; m += RM) block<RM, C>(x + m * k_size, k_size, w, pairs, panel, y + m * ldy, ldy, mask);
  const int64_t left = m_size - m;
  const uint16_t* xr = x + m * k_size;
  float* yr = y + m * ldy;
  switch (left) {
    case 5: block<5, C>(xr, k_size, w, pairs, panel, yr, ldy, mask); break;
    case 4: block<4, C>(xr, k_size, w, pairs, panel, yr, ldy, mask); break;
    case 3: block<3, C>(xr, k_size, w, pairs, panel, yr, ldy, mask); break;
    case 2: block<2, C>(xr, k_size, w, pairs, panel, yr, ldy, mask); break;
    case 1: block<1, C>(xr, k_size, w, pairs, panel, yr, ldy, mask); break;
    default: break;
  }
}

// Columns [b * 16, b * 16 + 16) of panel b that lie in [start, stop), as a store mask.
inline __mmask16 columns_mask(int64_t b, int64_t start, int64_t stop) {
  const int64_t lo = std::max<int64_t>(start - b * kLanes, 0), hi = std::min<int64_t>(stop - b * kLanes, kLanes);
  if (hi <= lo) return 0;
  return static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
}

// x [M, K] against `count` (<= C) consecutive panels w: rows<C> for a whole group, else panel by panel.
template <int C>
inline void group(const uint16_t* x, int64_t m_size, int64_t k_size, const uint16_t* w, int64_t pairs,
                  int64_t panel, int64_t count, float* y, int64_t ldy, const __mmask16* mask) {
  if (count == C) {
    rows<C>(x, m_size, k_size, w, pairs, panel, y, ldy, mask);
    return;
  }
  for (int64_t c = 0; c < count; ++c)
    rows<1>(x, m_size, k_size, w + c * panel, pairs, panel, y + c * kLanes, ldy, mask + c);
}

}  // namespace specdec_bf16_panels
