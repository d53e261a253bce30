// y = x @ w.T for bfloat16 rows against a weight packed in 16-column panels, on CPUs with AVX512-BF16: the LM head.
//
// Why: bf16_rows_linear.cpp gives each output its own 16-lane dot product and sums the lanes at the end; over a
// 262,144-row LM head at 16-32 rows (a batch's decode step) those sums and its scattered 16-byte stores held
// it near 200 GFLOP/s, against about 350 on the layers' matrices. Here the weight is packed once
// (pack_bf16_panels: for each block of 16 output columns, the K values of each column in pairs, 64 bytes per
// pair of k) and each output column is one float32 lane: the x pair (broadcast) times the 16 columns' pairs,
// accumulated in ascending k by VDPBF16PS, stored 16 columns at a time. No lane sums; every output is the
// same chain whatever the number of rows, the blocking or the threads, so a row never depends on M.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

namespace {

constexpr int64_t kLanes = 16;

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
    for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * panel + p * 32);
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

}  // namespace

// w [N, K] bfloat16 -> [ceil(N / 16), ceil(K / 2), 32] bfloat16: panel b, pair p holds columns 16b..16b+15's
// values k = 2p, 2p + 1 (zeros past N and K).
at::Tensor pack_bf16_panels(at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2, "bfloat16 w [N, K]");
  w = w.contiguous();
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kLanes - 1) / kLanes, pairs = (k + 1) / 2;
  auto out = at::zeros({panels, pairs, 2 * kLanes}, w.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, panels, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t col = 0; col < kLanes && b * kLanes + col < n; ++col) {
        const uint16_t* row = src + (b * kLanes + col) * k;
        uint16_t* d = dst + b * pairs * 2 * kLanes + 2 * col;
        for (int64_t i = 0; i < k; ++i) d[(i / 2) * 2 * kLanes + (i % 2)] = row[i];
      }
  });
  return out;
}

// float32 x [M, K] @ w.T over the output columns [start, stop) of a packed w (pack_bf16_panels of [N, K]).
at::Tensor packed_rows_linear(at::Tensor x, at::Tensor packed, int64_t n_size, int64_t start, int64_t stop) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == 2 * kLanes, "x [M, K], packed [P, K/2, 32]");
  TORCH_CHECK(packed.size(1) == (x.size(1) + 1) / 2 && packed.size(0) == (n_size + kLanes - 1) / kLanes,
              "packed panels do not match x's K or N");
  TORCH_CHECK(0 <= start && start <= stop && stop <= n_size, "columns outside [0, N)");
  x = x.contiguous();
  packed = packed.contiguous();
  const int64_t m_size = x.size(0), k_size = x.size(1), pairs = packed.size(1), width = stop - start;
  auto y = at::empty({m_size, width}, x.options().dtype(at::kFloat));
  if (m_size == 0 || width == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  const int64_t panel = pairs * 2 * kLanes;
  const int64_t first = start / kLanes, last = (stop + kLanes - 1) / kLanes;  // panels [first, last)
  // a panel's columns inside [start, stop), and where its first column lands in y (may be before y's start:
  // the masked lanes are never stored)
  auto mask_of = [&](int64_t b) -> __mmask16 {
    const int64_t lo = std::max<int64_t>(start - b * kLanes, 0), hi = std::min<int64_t>(stop - b * kLanes, kLanes);
    return static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
  };
  const int C = m_size <= 2 ? 8 : 4;
  const int64_t groups = (last - first + C - 1) / C;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t b = first + g * C, count = std::min<int64_t>(C, last - b);
    __mmask16 mask[8];
    for (int c = 0; c < 8; ++c) mask[c] = c < count ? mask_of(b + c) : 0;
    const uint16_t* w = wp + b * panel;
    float* out = yp + (b * kLanes - start);  // column b * 16 of y's row 0 (masked lanes before start unused)
    if (count == C && C == 8) rows<8>(xp, m_size, k_size, w, pairs, panel, out, width, mask);
    else if (count == C && C == 4) rows<4>(xp, m_size, k_size, w, pairs, panel, out, width, mask);
    else
      for (int64_t c = 0; c < count; ++c)
        rows<1>(xp, m_size, k_size, w + c * panel, pairs, panel, out + c * kLanes, width, mask + c);
  }
  return y;
}

#pragma GCC pop_options
