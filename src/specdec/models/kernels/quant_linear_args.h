// The argument checks of quant_linear, shared by its AVX2 and AVX512-VNNI builds (avx2_quant_linear.cpp,
// avx512_vnni_quant_linear.cpp), whose weight layouts differ only in their tile width.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <limits>
#include <vector>

#include "avx2_bf16.h"

namespace specdec_quant {

// x [M, K] float32 or bfloat16 (made contiguous here) against the tiled weight's tensors for `kind` (0: s8, 1: u4) with
// `tile` output columns per tile and K in blocks of `block`; returns whether s8 sub-scales are given. Kinds 3
// (s8r) and 4 (u4r) quantize x per row (the modules' quant_linear_row_kinds). Scales are
// float32 or float16 (GGUF's own fp16 scales, read exactly: 2 bytes a block less), u4's mins the same type;
// kind 2 is s5 (s8 quants in -16..15 as nibbles and a bit plane).
inline bool check_quant_args(at::Tensor& x, const at::Tensor& quants, const at::Tensor& scales, const at::Tensor& mins,
                             const at::Tensor& sub_scales, int64_t kind, int64_t tile, int64_t block) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "x [M, K] on the CPU");
  TORCH_CHECK(kind >= 0 && kind <= 4, "kind 0 (s8), 1 (u4), 2 (s5), 3 (s8r: x per row) or 4 (u4r: x per row)");
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) x = x.to(at::kFloat);  // read as is
  if (!x.is_contiguous()) x = x.contiguous();
  TORCH_CHECK(x.size(1) % block == 0, "K must be a multiple of 32");
  const int64_t blocks = x.size(1) / block, tiles = quants.size(0);
  TORCH_CHECK(quants.dim() == 5 && quants.size(1) == blocks &&
              quants.size(2) == (kind == 0 || kind == 3 ? 8 : kind == 1 || kind == 4 ? 4 : 5) &&
              quants.size(3) == tile && quants.size(4) == 4 && quants.is_contiguous(), "quants layout");
  TORCH_CHECK(scales.is_contiguous() && mins.is_contiguous() && sub_scales.is_contiguous(), "contiguous");
  const bool sub = kind == 0 && sub_scales.numel() > 0;
  TORCH_CHECK((scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf) &&
              (kind >= 3 ? scales.numel() == tiles * tile
                         : scales.numel() == tiles * blocks * tile ||
                               (kind == 0 && !sub && scales.numel() == tiles * tile)),
              "scales layout (kinds 3 and 4: one per column)");
  TORCH_CHECK(kind != 3 || x.size(1) <= 32768, "kind 3 sums a row in int32: K at most 32768");
  TORCH_CHECK(kind < 3 || mins.numel() == 0 || (mins.scalar_type() == at::kFloat && mins.numel() == x.size(1)),
              "kinds 3 and 4: mins empty or x's per-channel multipliers, [K] float32");
  TORCH_CHECK(kind != 4 || (sub_scales.scalar_type() == at::kShort &&
                            sub_scales.numel() == tiles * ((blocks + 1) / 2) * 4 * tile),
              "kind 4: sub_scales int16 [tiles, pairs of blocks, 4 * tile] (a and -c)");
  if (sub)
    TORCH_CHECK(sub_scales.scalar_type() == at::kShort && sub_scales.numel() == tiles * blocks * tile * 2, "sub");
  if (kind == 1)
    TORCH_CHECK(mins.scalar_type() == scales.scalar_type() && mins.numel() == tiles * blocks * tile, "mins");
  return sub;
}

// Calls f(R, m) over the rows in blocks of 4, then one block of the 1-3 left (R a compile-time constant): the
// AVX2 loops keep R rows' sums in registers.
template <typename F>
void for_row_blocks(int64_t m_size, F&& f) {
  int64_t m = 0;
  for (; m + 4 <= m_size; m += 4) f(std::integral_constant<int, 4>{}, m);
  switch (m_size - m) {
    case 3: f(std::integral_constant<int, 3>{}, m); break;
    case 2: f(std::integral_constant<int, 2>{}, m); break;
    case 1: f(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

// Scales between one block's and the next in a tile: s8 without sub-scales may store one scale per column
// (int8 per output channel: the same value in every block, 2 bytes a block of 32 fewer to read), read for
// every block as the per-block layout would give it, so the arithmetic and the bits are the same.
inline int64_t scale_step(const at::Tensor& scales, const at::Tensor& quants, int64_t tile) {
  return scales.numel() == quants.size(0) * tile && quants.size(1) > 1 ? 0 : tile;
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
  const int64_t n = x.numel();
  scratch.resize(n);
  int64_t i = 0;
  // 8 at a time (a shift into the high half): the scalar loop took 1.2 ns an element, 27 us of a 16-row
  // call with K = 2048
  for (; i + 8 <= n; i += 8) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(scratch.data() + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
  for (; i < n; ++i) scratch[i] = specdec_bf16::bf16_to_float(h[i]);
  return scratch.data();
}

// Each row's greedy token over the first n_valid columns, as rows_argmax (kernels/avx2_rows_argmax.cpp) picks
// it from the float32 values: the first NaN, else the first index of the maximum. Why: the LM head's float32
// logits are 1 MB a row over a 262k vocabulary, and writing them, then reading them back for the argmax, cost
// 0.13 ms a row of a decode step. Each thread keeps, per row, the best column among those it computed; the
// merge applies the same rule, so the answer depends neither on the order columns come in nor on the threads.
struct RowMaxima {
  int64_t m, n_valid, threads;
  std::vector<float> best;            // [threads][m] the largest non-NaN value seen
  std::vector<int64_t> at, nan_at;    // its column, the first NaN's (-1: none yet)

  RowMaxima(int64_t m_size, int64_t n, int64_t num_threads)
      : m(m_size), n_valid(n), threads(std::max<int64_t>(1, num_threads)),
        best(threads * m_size, 0.0f), at(threads * m_size, -1), nan_at(threads * m_size, -1) {}

  // n values of `row` from column `col`, on the calling thread. A block whose maximum is below the row's
  // best so far and that holds no NaN is passed over after one vector max: the common case.
  void offer(int64_t row, int64_t col, const float* v, int64_t n) {
    n = std::min(n, n_valid - col);  // padded columns of the last tile are no tokens
    if (n <= 0) return;
    const int64_t k = std::min<int64_t>(omp_get_thread_num(), threads - 1) * m + row;
    if (at[k] >= 0 && n % 8 == 0) {
      __m256 mx = _mm256_loadu_ps(v), unord = _mm256_cmp_ps(mx, mx, _CMP_UNORD_Q);
      for (int64_t i = 8; i < n; i += 8) {
        const __m256 x = _mm256_loadu_ps(v + i);
        unord = _mm256_or_ps(unord, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, x);
      }
      if (_mm256_movemask_ps(unord) == 0 &&
          _mm256_movemask_ps(_mm256_cmp_ps(mx, _mm256_set1_ps(best[k]), _CMP_GE_OQ)) == 0)
        return;
    }
    for (int64_t i = 0; i < n; ++i) consider(k, v[i], col + i);
  }

  void consider(int64_t k, float x, int64_t column) {
    if (std::isnan(x)) {
      if (nan_at[k] < 0 || column < nan_at[k]) nan_at[k] = column;
    } else if (at[k] < 0 || x > best[k] || (x == best[k] && column < at[k])) {
      best[k] = x;
      at[k] = column;
    }
  }

  // [m] int64: the threads' candidates merged by the same rule; with `values` ([m] float32) also each
  // row's value there (NaN where the pick is a NaN)
  at::Tensor result(const at::TensorOptions& options, at::Tensor* values = nullptr) const {
    at::Tensor out = at::empty({m}, options.dtype(at::kLong));
    int64_t* o = out.data_ptr<int64_t>();
    float* val = nullptr;
    if (values != nullptr) {
      *values = at::empty({m}, options.dtype(at::kFloat));
      val = values->data_ptr<float>();
    }
    for (int64_t r = 0; r < m; ++r) {
      int64_t nan = -1, pick = -1;
      float top = 0.0f;
      for (int64_t t = 0; t < threads; ++t) {
        const int64_t k = t * m + r;
        if (nan_at[k] >= 0 && (nan < 0 || nan_at[k] < nan)) nan = nan_at[k];
        if (at[k] >= 0 && (pick < 0 || best[k] > top || (best[k] == top && at[k] < pick))) top = best[k], pick = at[k];
      }
      o[r] = nan >= 0 ? nan : std::max<int64_t>(pick, 0);
      if (val != nullptr) val[r] = nan >= 0 ? kNaN : top;
    }
    return out;
  }
};

// quant_linear's result [M, N]: float32, or bfloat16 rounded as c10::BFloat16 rounds the float32 (the
// decoder's dtype, without a second torch op and pass over y). A tile's columns are stored as they finish.
// With `maxima` set, nothing is stored (y is [M, 0]): each row's columns go to its argmax instead.
struct OutputRows {
  at::Tensor y;
  float* f = nullptr;
  uint16_t* h = nullptr;
  int64_t ld = 0;
  RowMaxima* maxima = nullptr;

  OutputRows(const at::Tensor& x, int64_t n_size, bool bf16)
      : y(at::empty({x.size(0), n_size}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat))), ld(n_size) {
    if (bf16)
      h = static_cast<uint16_t*>(y.data_ptr());
    else
      f = y.data_ptr<float>();
  }

  OutputRows(const at::Tensor& x, RowMaxima* m) : y(at::empty({x.size(0), 0}, x.options().dtype(at::kFloat))),
                                                   maxima(m) {}

  // n float32 values of `row`, from column `col`
  void store(int64_t row, int64_t col, const float* v, int64_t n) const {
    if (maxima != nullptr) {
      maxima->offer(row, col, v, n);
      return;
    }
    if (f != nullptr) {
      std::memcpy(f + row * ld + col, v, sizeof(float) * n);
      return;
    }
    uint16_t* out = h + row * ld + col;
    int64_t i = 0;
    // 16 at a time where the CPU has AVX512 (the same rounding): the scalar loop cost 0.12 ms a row of a
    // step's 72 layer linears, a fifth of a 16-row verification's linears on the AMX-INT8 path
    if (n >= 16 && specdec_bf16::has_avx512()) i = store_bf16x16(out, v, n);
    // and 8 at a time on AVX2 (the scalar loop cost the 4-bit kernels 5-13% at 1-16 rows on the EPYC)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), specdec_bf16::to_bf16x8(_mm256_loadu_ps(v + i)));
    for (; i < n; ++i) out[i] = specdec_bf16::float_to_bf16(v[i]);
  }

  // the first n / 16 * 16 values rounded as float_to_bf16; returns how many
  SPECDEC_AVX512 static int64_t store_bf16x16(uint16_t* out, const float* v, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), specdec_bf16::to_bf16x16(_mm512_loadu_ps(v + i)));
    return i;
  }
};

// A build's core: quantizes x's rows and runs every tile against them into y (values, or each row's argmax).
using RunTiles = void (*)(at::Tensor x, const at::Tensor& quants, const at::Tensor& scales, const at::Tensor& mins,
                          const at::Tensor& sub_scales, int64_t kind, bool sub, const OutputRows& y);

// quant_linear of a build with `tile` columns per tile: [M, N] float32, or bfloat16 with out_bf16.
inline at::Tensor linear_values(RunTiles run, int64_t tile, int64_t block, at::Tensor x, const at::Tensor& quants,
                                const at::Tensor& scales, const at::Tensor& mins, const at::Tensor& sub_scales,
                                int64_t kind, bool out_bf16) {
  const bool sub = check_quant_args(x, quants, scales, mins, sub_scales, kind, tile, block);
  const OutputRows y(x, quants.size(0) * tile, out_bf16);
  run(x, quants, scales, mins, sub_scales, kind, sub, y);
  return y.y;
}

// [M] int64: rows_argmax(quant_linear(x, ...)[:, :n_valid]) without the values (see RowMaxima).
inline at::Tensor linear_argmax(RunTiles run, int64_t tile, int64_t block, at::Tensor x, const at::Tensor& quants,
                                const at::Tensor& scales, const at::Tensor& mins, const at::Tensor& sub_scales,
                                int64_t kind, int64_t n_valid) {
  const bool sub = check_quant_args(x, quants, scales, mins, sub_scales, kind, tile, block);
  TORCH_CHECK(n_valid > 0 && n_valid <= quants.size(0) * tile, "n_valid: 1 to the tiles' columns");
  RowMaxima maxima(x.size(0), n_valid, at::get_num_threads());
  run(x, quants, scales, mins, sub_scales, kind, sub, OutputRows(x, &maxima));
  return maxima.result(x.options());
}

// (indices [M] int64, values [M] float32): linear_argmax's picks and quant_linear's value there (the first
// NaN's index and NaN where a row has one), for greedy verification's early exit, which compares slices of
// the vocabulary by their best values without writing their logits.
inline std::tuple<at::Tensor, at::Tensor> linear_max(RunTiles run, int64_t tile, int64_t block, at::Tensor x,
                                                     const at::Tensor& quants, const at::Tensor& scales,
                                                     const at::Tensor& mins, const at::Tensor& sub_scales,
                                                     int64_t kind, int64_t n_valid) {
  const bool sub = check_quant_args(x, quants, scales, mins, sub_scales, kind, tile, block);
  TORCH_CHECK(n_valid > 0 && n_valid <= quants.size(0) * tile, "n_valid: 1 to the tiles' columns");
  RowMaxima maxima(x.size(0), n_valid, at::get_num_threads());
  run(x, quants, scales, mins, sub_scales, kind, sub, OutputRows(x, &maxima));
  at::Tensor values;
  at::Tensor indices = maxima.result(x.options(), &values);
  return {indices, values};
}

}  // namespace specdec_quant
