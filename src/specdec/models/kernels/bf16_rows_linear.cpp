// y = x @ w.T for a few rows of bfloat16 x (decode and verification steps), on CPUs with AVX512-BF16.
//
// Why: at decode time a linear layer is a matrix-vector product bound by reading the weights; oneDNN's
// bfloat16 path reaches well under the memory bandwidth there, and its single-row (GEMV) path rounds
// differently from its multi-row path. Here every output element is one dot product accumulated in
// float32 in a fixed order (32-wide chunks along K, then a fixed tree over the 16 lanes), whatever the
// number of rows or threads: a row's result never depends on how many rows share the call. Output is
// float32. The lane sums of 16 accumulators are done together (sum16: 15 vector adds instead of 16
// horizontal reductions, which cost about as much as the products themselves at K = 640), each
// accumulator by the same tree wherever it sits, so the block shape changes no bits.
// With several rows (verification) each weight block becomes compute-bound; software prefetches a few
// blocks ahead keep the weights streaming meanwhile (they change no arithmetic, so no result).
// Built with avx2_module.cpp and the AVX2 attention files (whose flags are AVX2's): the target pragma
// enables AVX512-BF16 for this file only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

namespace {

#ifndef PREFETCH_BLOCKS
#define PREFETCH_BLOCKS 4
#endif

// Lane i of the result is the sum of a[i]'s 16 lanes, for every i by the same tree:
// ((l0 + l8) + (l4 + l12)) + ((l2 + l10) + (l6 + l14)), plus the same for l1, l3, ... , then the two.
// Lanes come out in the order 4 * (i % 4) + i / 4 (see kSum16Lane).
inline __m512 sum16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int j = 0; j < 8; ++j)  // 128-bit chunks: [a2j: l+l8 for l 0-3, 4-7 | a2j+1: the same]
    b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // chunk m: a(4j + m), lanes (l + l8) + (l4 + l12) for l 0-3
    c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xDD));
  for (int j = 0; j < 2; ++j)  // chunk m: a(8j + m) as (l0-part + l2-part, l1 + l3), then a(8j + 4 + m)
    d[j] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * j], c[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(c[2 * j], c[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // chunk m: a(m), a(4 + m), a(8 + m), a(12 + m)
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// R rows of x against C consecutive rows of w (R * C <= 16): R * C independent float32 accumulator chains
// (so the dot-product latency is hidden), each summing its 32-wide chunks in k order, then sum16.
template <int R, int C, bool PREFETCH = false>
inline void dot_block(const uint16_t* w, const uint16_t* x, int64_t k_size, float* y, int64_t n_size,
                      int64_t ahead = 0) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= k_size; k += 32) {
    __m512bh wv[C];
    for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * k_size + k);
    if (PREFETCH)
      for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(w + ahead + c * k_size + k), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * k_size + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  if (k < k_size) {
    const __mmask32 mask = (__mmask32)((1ull << (k_size - k)) - 1);
    __m512bh wv[C];
    for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + c * k_size + k);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + r * k_size + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  static_assert(R * C <= 16, "sum16 takes 16 accumulators");
  __m512 all[16];
  for (int i = 0; i < 16; ++i) all[i] = i < R * C ? acc[i / C][i % C] : _mm512_setzero_ps();
  // back to natural order: lane i from lane 4 * (i % 4) + i / 4
  const __m512i natural = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  const __m512 sums = _mm512_permutexvar_ps(natural, sum16(all));
  if (R == 1 && C == 16) {
    _mm512_storeu_ps(y, sums);
    return;
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, sums);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * n_size + c] = out[r * C + c];
}

template <int C>
inline void rows_block(const uint16_t* w, const uint16_t* x, int64_t m_size, int64_t k_size, float* y,
                       int64_t n_size) {
  int64_t m = 0;
  for (; m + 4 <= m_size; m += 4) dot_block<4, C>(w, x + m * k_size, k_size, y + m * n_size, n_size);
  switch (m_size - m) {
    case 3: dot_block<3, C>(w, x + m * k_size, k_size, y + m * n_size, n_size); break;
    case 2: dot_block<2, C>(w, x + m * k_size, k_size, y + m * n_size, n_size); break;
    case 1: dot_block<1, C>(w, x + m * k_size, k_size, y + m * n_size, n_size); break;
    default: break;
  }
}

// Several rows: the first row block also prefetches the weights `ahead` elements on (a later column block).
template <int C>
inline void rows_block_prefetch(const uint16_t* w, const uint16_t* x, int64_t m_size, int64_t k_size, float* y,
                                int64_t n_size, int64_t ahead) {
  int64_t m;
  switch (m_size >= 4 ? 4 : m_size) {
    case 4: dot_block<4, C, true>(w, x, k_size, y, n_size, ahead); m = 4; break;
    case 3: dot_block<3, C, true>(w, x, k_size, y, n_size, ahead); m = 3; break;
    default: dot_block<2, C, true>(w, x, k_size, y, n_size, ahead); m = 2; break;
  }
  rows_block<C>(w, x + m * k_size, m_size - m, k_size, y + m * n_size, n_size);
}

}  // namespace

at::Tensor rows_linear(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K]");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t m_size = x.size(0), k_size = x.size(1), n_size = w.size(0);
  auto y = at::empty({m_size, n_size}, x.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  if (m_size <= 1) {  // bound by reading the weights: the hardware prefetcher keeps up (0 rows: nothing)
    constexpr int64_t C1 = 16;  // one row against 16 weight rows: one sum16 per 16 outputs
    const int64_t blocks1 = m_size == 1 ? n_size / C1 : 0;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
    for (int64_t b = 0; b < blocks1; ++b) dot_block<1, C1>(wp + b * C1 * k_size, xp, k_size, yp + b * C1, n_size);
    for (int64_t n = blocks1 * C1; n < n_size && m_size == 1; ++n)
      dot_block<1, 1>(wp + n * k_size, xp, k_size, yp + n, n_size);
    return y;
  }
  constexpr int64_t C = 4;
  const int64_t blocks = n_size / C;
  {
    // Several rows make each weight block compute-bound, and the hardware prefetcher alone then lets the
    // memory idle meanwhile: prefetch PREFETCH_BLOCKS blocks ahead so streaming and arithmetic overlap.
    constexpr int64_t ahead = PREFETCH_BLOCKS * C;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
    for (int64_t b = 0; b < blocks; ++b) {
      if (b + PREFETCH_BLOCKS < blocks)
        rows_block_prefetch<C>(wp + b * C * k_size, xp, m_size, k_size, yp + b * C, n_size, ahead * k_size);
      else
        rows_block<C>(wp + b * C * k_size, xp, m_size, k_size, yp + b * C, n_size);
    }
  }
  for (int64_t n = blocks * C; n < n_size; ++n) rows_block<1>(wp + n * k_size, xp, m_size, k_size, yp + n, n_size);
  return y;
}

#pragma GCC pop_options
