// y = x @ w.T for bfloat16 x [M, K] and w [N, K], float32 out, on CPUs with AVX2 + FMA (no AVX512-BF16).
//
// Why: torch's bfloat16 GEMMs on such CPUs are row-invariant but very slow, and no library promises that
// a row's bits do not depend on how many rows share the call. Here every output element is one dot product
// with a fixed order, whatever M, N, the blocking or the thread count:
//   K is read in chunks of 16 (zero-padded at the end). One 256-bit load of 16 bfloat16 weights gives the
//   8 even elements (shifted left 16 bits) and the 8 odd ones (low halves cleared) as float32; x is
//   converted once per call into the same layout ([8 even][8 odd] floats per chunk). Each output element
//   has one 8-lane float32 accumulator: per chunk, FMA with the even lanes, then with the odd lanes, chunks
//   in k order; then the fixed 8-lane sum of reduce8 below.
// Blocking (4 rows x 3 columns of accumulators for M >= 4, 1 x 8 for a single row, ...), threads (over
// tiles of columns), where the weights are converted (in registers for few rows, once per tile into a
// float32 buffer for many: kSplitOnceRows) and the form (dot products, or from kPanelRows rows on the same
// chains as an outer product, avx2_lane_panels.h) only decide which element is computed when, never how.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "avx2_lane_panels.h"

namespace {

using namespace specdec_lanes;

// from this many rows on, a tile's weights are split into float32 once per tile (see rows_linear); below it
// rows_tile_all's single pass over the tile was faster (2-core EPYC, all 72 linears of Gemma 3 270M with cold
// weights: 12 rows 0.84x, 16 rows 0.90x the time of the split, 24 rows 1.02x)
#ifndef SPLIT_ONCE
#define SPLIT_ONCE 20
#endif
constexpr int64_t kSplitOnceRows = SPLIT_ONCE;
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif
#ifndef TILE_BIG
#define TILE_BIG 48
#endif

// out[i] = ((v_i[0] + v_i[1]) + (v_i[2] + v_i[3])) + ((v_i[4] + v_i[5]) + (v_i[6] + v_i[7])): the one
// horizontal sum every element goes through (lanes are independent, so padding with zeros changes nothing).
inline __m256 reduce8(const __m256* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Each of the R * C accumulators through reduce8, into y (row r, column c at y[r * ldy + c]).
template <int R, int C>
inline void store_block(const __m256* acc, float* y, int64_t ldy) {
  for (int g = 0; g < R * C; g += 8) {
    __m256 v[8];
    for (int i = 0; i < 8; ++i) v[i] = g + i < R * C ? acc[g + i] : _mm256_setzero_ps();
    alignas(32) float out[8];
    _mm256_store_ps(out, reduce8(v));
    for (int i = 0; i < 8 && g + i < R * C; ++i) y[((g + i) / C) * ldy + (g + i) % C] = out[i];
  }
}

// R rows of x (converted, row stride kp) against C consecutive rows of w (row stride k_size): R * C
// independent accumulator chains (even pass then odd pass per chunk). With pf, also prefetches the same
// span of weights at pf (the next tile's): prefetches change no arithmetic, so no result.
template <int R, int C>
inline void dot_block(const uint16_t* w, int64_t k_size, const float* x, int64_t kp, float* y, int64_t ldy,
                      const uint16_t* pf = nullptr) {
  __m256 acc[R * C];
  for (int i = 0; i < R * C; ++i) acc[i] = _mm256_setzero_ps();
  const int64_t full = k_size / kChunk;
  for (int64_t j = 0; j < full; ++j) {
    const int64_t k = j * kChunk;
    if (pf && (j & 1) == 0)  // a 64-byte line holds two chunks
      for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(pf + c * k_size + k), PF_HINT);
    __m256 wv[C];
    for (int c = 0; c < C; ++c)
      wv[c] = _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * k_size + k)), 16));
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * kp + k);
      for (int c = 0; c < C; ++c) acc[r * C + c] = _mm256_fmadd_ps(xv, wv[c], acc[r * C + c]);
    }
    for (int c = 0; c < C; ++c)  // the odd halves by two shifts: a mask constant would take a 17th register
      wv[c] = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * k_size + k)), 16), 16));
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * kp + k + 8);
      for (int c = 0; c < C; ++c) acc[r * C + c] = _mm256_fmadd_ps(xv, wv[c], acc[r * C + c]);
    }
  }
  if (full * kChunk < k_size) {  // last chunk, zero-padded (x is padded already)
    const int64_t k = full * kChunk, rest = k_size - k;
    __m256 we[C], wo[C];
    for (int c = 0; c < C; ++c) split_bf16(load_chunk(w + c * k_size + k, rest), we[c], wo[c]);
    for (int r = 0; r < R; ++r) {
      const __m256 xe = _mm256_loadu_ps(x + r * kp + k), xo = _mm256_loadu_ps(x + r * kp + k + 8);
      for (int c = 0; c < C; ++c) {
        acc[r * C + c] = _mm256_fmadd_ps(xe, we[c], acc[r * C + c]);
        acc[r * C + c] = _mm256_fmadd_ps(xo, wo[c], acc[r * C + c]);
      }
    }
  }
  store_block<R, C>(acc, y, ldy);
}

// R rows against the columns [0, cols) of a tile, C at a time, the rest one by one; with pf, prefetching
// the next tile's weights meanwhile (pf: where they start; the caller passes it for a tile's first rows).
template <int R, int C>
inline void rows_tile(const uint16_t* w, int64_t k_size, const float* x, int64_t kp, float* y, int64_t ldy,
                      int64_t cols, const uint16_t* pf) {
  int64_t c = 0;
  for (; c + C <= cols; c += C)
    dot_block<R, C>(w + c * k_size, k_size, x, kp, y + c, ldy, pf ? pf + c * k_size : nullptr);
  for (; c < cols; ++c) dot_block<R, 1>(w + c * k_size, k_size, x, kp, y + c, ldy, pf ? pf + c * k_size : nullptr);
}

// Every row of x (m_size >= 4, stride kp) against the columns [0, cols) of a tile, three at a time: each block
// of three columns runs all the row blocks (4 rows, then the rest) while its weights sit in L1, so the tile is
// read from memory once, in one pass that overlaps the arithmetic (the first row block also prefetches the
// next tile's weights, pf). Rows block by block over the whole tile instead read it from memory for the first
// block, then compute with the memory idle: 8 rows took twice the time of 4.
inline void rows_tile_all(const uint16_t* w, int64_t k_size, const float* x, int64_t m_size, int64_t kp, float* y,
                          int64_t ldy, int64_t cols, const uint16_t* pf) {
  const int64_t full = m_size / 4 * 4, rest = m_size - full;
  const auto block = [&](auto one, int64_t c) {
    constexpr int C = decltype(one)::value;
    const uint16_t* wc = w + c * k_size;
    for (int64_t m = 0; m < full; m += 4)
      dot_block<4, C>(wc, k_size, x + m * kp, kp, y + m * ldy + c, ldy, m == 0 && pf ? pf + c * k_size : nullptr);
    switch (rest) {
      case 3: dot_block<3, C>(wc, k_size, x + full * kp, kp, y + full * ldy + c, ldy); break;
      case 2: dot_block<2, C>(wc, k_size, x + full * kp, kp, y + full * ldy + c, ldy); break;
      case 1: dot_block<1, C>(wc, k_size, x + full * kp, kp, y + full * ldy + c, ldy); break;
      default: break;
    }
  };
  int64_t c = 0;
  for (; c + 3 <= cols; c += 3) block(std::integral_constant<int, 3>{}, c);
  for (; c < cols; ++c) block(std::integral_constant<int, 1>{}, c);
}

// The same chains as dot_block, with the weights already split into float32 in the chunk layout ([8 even]
// [8 odd] per 16, zero-padded to kp like x): the FMAs, their operands and their order are those of dot_block
// (its zero-padded last chunk included), so every element has the same bits; only the conversion moved.
template <int R, int C>
inline void dot_block_f32(const float* w, const float* x, int64_t kp, float* y, int64_t ldy) {
  __m256 acc[R * C];
  for (int i = 0; i < R * C; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kp; k += kChunk) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm256_load_ps(w + c * kp + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * kp + k);
      for (int c = 0; c < C; ++c) acc[r * C + c] = _mm256_fmadd_ps(xv, wv[c], acc[r * C + c]);
    }
    for (int c = 0; c < C; ++c) wv[c] = _mm256_load_ps(w + c * kp + k + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * kp + k + 8);
      for (int c = 0; c < C; ++c) acc[r * C + c] = _mm256_fmadd_ps(xv, wv[c], acc[r * C + c]);
    }
  }
  store_block<R, C>(acc, y, ldy);
}

template <int R, int C>
inline void rows_tile_f32(const float* w, const float* x, int64_t kp, float* y, int64_t ldy, int64_t cols) {
  int64_t c = 0;
  for (; c + C <= cols; c += C) dot_block_f32<R, C>(w + c * kp, x, kp, y + c, ldy);
  for (; c < cols; ++c) dot_block_f32<R, 1>(w + c * kp, x, kp, y + c, ldy);
}

// x [M, K] bfloat16 -> [M, kp] float32 in the chunk layout ([8 even][8 odd] per 16), zero-padded.
void convert_rows(const uint16_t* x, int64_t m_size, int64_t k_size, float* xf, int64_t kp, bool threads = true) {
  const int64_t full = k_size / kChunk;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads()) if (threads && m_size * k_size > (1 << 16))
  for (int64_t m = 0; m < m_size; ++m) {
    const uint16_t* src = x + m * k_size;
    float* dst = xf + m * kp;
    __m256 even, odd;
    for (int64_t j = 0; j < full; ++j) {
      split_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j * kChunk)), even, odd);
      _mm256_storeu_ps(dst + j * kChunk, even);
      _mm256_storeu_ps(dst + j * kChunk + 8, odd);
    }
    if (full * kChunk < k_size) {
      split_bf16(load_chunk(src + full * kChunk, k_size - full * kChunk), even, odd);
      _mm256_storeu_ps(dst + full * kChunk, even);
      _mm256_storeu_ps(dst + full * kChunk + 8, odd);
    }
  }
}

// cols rows of w (bfloat16, row stride k_size) -> panels [p][8 lanes][t_size][16 columns] of float32, zero
// past k_size and past cols (those columns are computed and dropped). Per chunk of 16 along K and 8 columns:
// the even and the odd halves of 8 rows (split_bf16), each transposed so that a lane's 8 columns are one store.
void lane_panels(const uint16_t* w, int64_t cols, int64_t k_size, int64_t kp, float* wl) {
  const int64_t t_size = kp / kLanes;
  for (int64_t n0 = 0; n0 < cols; n0 += 8) {
    float* dst = wl + (n0 / kPanel) * kLanes * t_size * kPanel + n0 % kPanel;
    for (int64_t j = 0; j < kp / kChunk; ++j) {
      __m256 even[8], odd[8], out[8];
      for (int64_t c = 0; c < 8; ++c)  // columns past the tile: zeros
        split_bf16(load_chunk(w + (n0 + c) * k_size + j * kChunk, n0 + c < cols ? k_size - j * kChunk : 0), even[c],
                   odd[c]);
      transpose8(even, out);
      for (int64_t l = 0; l < kLanes; ++l) _mm256_store_ps(dst + (l * t_size + 2 * j) * kPanel, out[l]);
      transpose8(odd, out);
      for (int64_t l = 0; l < kLanes; ++l) _mm256_store_ps(dst + (l * t_size + 2 * j + 1) * kPanel, out[l]);
    }
  }
  if (cols % kPanel != 0 && cols % kPanel <= 8) {  // the last panel's second half: zero columns
    float* dst = wl + (cols / kPanel) * kLanes * t_size * kPanel + 8;
    for (int64_t i = 0; i < kLanes * t_size; ++i) _mm256_store_ps(dst + i * kPanel, _mm256_setzero_ps());
  }
}

// from this many rows on, rows_linear computes as an outer product (avx2_lane_panels.h); below, the weights'
// conversion per tile costs more than the form gains (2-core EPYC, the 72 linears of Gemma 3 270M, alternated:
// 64 rows 1.02x, 96 rows 0.96x, 256 rows 0.97x, 2048 rows 0.88x the time of the split-once path)
constexpr int64_t kPanelRows = 96;

// rows_linear for m_size >= kPanelRows, x already in lane_rows' layout (xl): each tile of panels is converted
// once into this thread's buffer, which stays in L2 while every row passes over it.
void panel_linear(const uint16_t* w, int64_t n_size, int64_t k_size, const float* xl, const RowBlocks& blocks,
                  int64_t kp, float* y) {
  over_tiles(n_size, [&](int64_t n0, int64_t cols, int64_t next_n0, int64_t next_cols) {
    thread_local std::vector<float> panel_buffer;
    panel_buffer.resize(static_cast<size_t>(3 * kPanel * kp) + 8);
    float* wl = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(panel_buffer.data()) + 31) & ~uintptr_t(31));
    lane_panels(w + n0 * k_size, cols, k_size, kp, wl);
    panel_tile(wl, xl, blocks, kp, y + n0, n_size, cols, reinterpret_cast<const char*>(w + next_n0 * k_size),
               next_cols * k_size * static_cast<int64_t>(sizeof(uint16_t)));
  });
}

}  // namespace

at::Tensor rows_linear(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K]");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "CPU tensors only");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t m_size = x.size(0), k_size = x.size(1), n_size = w.size(0);
  auto y = at::empty({m_size, n_size}, x.options().dtype(at::kFloat));
  if (m_size == 0 || n_size == 0) return y;
  const int64_t kp = (k_size + kChunk - 1) / kChunk * kChunk;
  auto xf = at::empty({m_size, kp}, x.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* xfp = xf.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (m_size >= kPanelRows) {  // xf holds x in lane_rows' layout instead
    const RowBlocks blocks = row_blocks(m_size);
    lane_rows(xp, m_size, k_size, kp, blocks, xfp);
    panel_linear(wp, n_size, k_size, xfp, blocks, kp, yp);
    return y;
  }
  convert_rows(xp, m_size, k_size, xfp, kp);

  // Threads split the columns into tiles (a multiple of 24, so every row-block shape fits whole). Within a
  // tile: up to 3 rows are one block over its columns; 4 to kSplitOnceRows - 1 rows run every block of rows
  // per three columns (rows_tile_all); more, each block of rows over the tile's float32 copy in L2.
  const int threads = at::get_num_threads();
  const int64_t tile = n_size >= 48 * 8 * threads ? TILE_BIG : 24;
  const int64_t tiles = (n_size + tile - 1) / tile;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n0 = t * tile, cols = std::min(tile, n_size - n0);
    const uint16_t* wt = wp + n0 * k_size;
    // The first block of rows also prefetches the next tile's weights (tiles are equal but the last): with
    // several rows a tile is compute-bound and the memory would idle meanwhile; with one row it still
    // streams faster than the hardware prefetcher alone.
    const uint16_t* pf = t + 1 < tiles && cols == tile ? wt + tile * k_size : nullptr;
    if (m_size >= kSplitOnceRows) {
      // Many rows: the tile's weights are split into float32 once (into this thread's buffer, which stays in
      // L2) instead of once per block of rows; the conversion was a third of the instructions per FMA.
      thread_local std::vector<float> split;
      split.resize(static_cast<size_t>(tile * kp) + 8);
      float* wf = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(split.data()) + 31) & ~uintptr_t(31));
      convert_rows(wt, cols, k_size, wf, kp, false);
      int64_t m = 0;
      for (; m + 4 <= m_size; m += 4) rows_tile_f32<4, 3>(wf, xfp + m * kp, kp, yp + m * n_size + n0, n_size, cols);
      switch (m_size - m) {
        case 3: rows_tile_f32<3, 4>(wf, xfp + m * kp, kp, yp + m * n_size + n0, n_size, cols); break;
        case 2: rows_tile_f32<2, 6>(wf, xfp + m * kp, kp, yp + m * n_size + n0, n_size, cols); break;
        case 1: rows_tile_f32<1, 8>(wf, xfp + m * kp, kp, yp + m * n_size + n0, n_size, cols); break;
        default: break;
      }
      continue;
    }
    switch (m_size) {  // up to 3 rows, one block as wide as the registers allow; more, rows_tile_all
      case 3: rows_tile<3, 4>(wt, k_size, xfp, kp, yp + n0, n_size, cols, pf); break;
      case 2: rows_tile<2, 6>(wt, k_size, xfp, kp, yp + n0, n_size, cols, pf); break;
      case 1: rows_tile<1, 8>(wt, k_size, xfp, kp, yp + n0, n_size, cols, pf); break;
      default: rows_tile_all(wt, k_size, xfp, m_size, kp, yp + n0, n_size, cols, pf); break;
    }
  }
  return y;
}
