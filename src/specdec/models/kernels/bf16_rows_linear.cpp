// y = x @ w.T for a few rows of bfloat16 x (decode and verification steps), on CPUs with AVX512-BF16.
//
// Why: at decode time a linear layer is a matrix-vector product bound by reading the weights; oneDNN's
// bfloat16 path reaches well under the memory bandwidth there, and its single-row (GEMV) path rounds
// differently from its multi-row path. Here every output element is one dot product accumulated in
// float32 in a fixed order (32-wide chunks along K, then a fixed horizontal sum), whatever the number of
// rows or threads: a row's result never depends on how many rows share the call. Output is float32.
// With several rows (verification) each weight block becomes compute-bound; software prefetches a few
// blocks ahead keep the weights streaming meanwhile (they change no arithmetic, so no result).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <immintrin.h>

namespace {

#ifndef PREFETCH_BLOCKS
#define PREFETCH_BLOCKS 4
#endif

// R rows of x against C consecutive rows of w: R * C independent float32 accumulator chains (so the
// dot-product latency is hidden), each summing its 32-wide chunks in k order, then a fixed horizontal sum.
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
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * n_size + c] = _mm512_reduce_add_ps(acc[r][c]);
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

torch::Tensor rows_linear(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K]");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t m_size = x.size(0), k_size = x.size(1), n_size = w.size(0);
  auto y = torch::empty({m_size, n_size}, x.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  constexpr int64_t C = 4;
  const int64_t blocks = n_size / C;
  if (m_size <= 1) {  // bound by reading the weights: the hardware prefetcher keeps up (0 rows: nothing)
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
    for (int64_t b = 0; b < blocks; ++b) rows_block<C>(wp + b * C * k_size, xp, m_size, k_size, yp + b * C, n_size);
  } else {
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

torch::Tensor probs_values(torch::Tensor probs, torch::Tensor values, torch::Tensor order, int64_t tokens);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rows_linear", &rows_linear, "float32 x @ w.T for bfloat16 rows, row-independent");
  m.def("probs_values", &probs_values, "attention probs @ values, per-row slot order, row-independent");
}
