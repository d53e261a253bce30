// The bfloat16 linears' arithmetic (avx2_rows_linear.cpp) as an outer product, for many rows.
//
// Every output element's lane l is a chain of FMAs over k = 16j + 2l, then 16j + 2l + 1, for j = 0, 1, ...
// (zero-padded to kp); its 8 lanes then go through reduce8's tree. Those chains do not care whether they run
// side by side along K (rows_linear's dot_block: one vector per element, lanes as vector lanes) or along the
// columns (here: one vector per 8 columns, one lane at a time), so both give the same bits. The outer product
// is the form that reaches the FMA peak: per step, the weights of 16 columns and one broadcast per row feed
// 12 FMAs (6 rows x 16 columns), against 7 loads and no reuse of x in dot_block.
//
// Layouts: x rows as lane_rows writes them; weights in panels of 16 columns, [8 lanes][t_size steps][16],
// t_size = kp / 8, either float32 (rows_linear converts a tile per call) or bfloat16 packed once
// (avx2_lane_panels_linear.cpp: step values 2i and 2i + 1 are columns i and 8 + i, the halves split_bf16 gives).
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace specdec_lanes {

constexpr int64_t kChunk = 16;
constexpr int64_t kLanes = 8;
constexpr int64_t kPanel = 16;  // columns of one panel: two float32 vectors
constexpr int kPanelRowsMax = 6;  // rows of one block: 12 accumulators, 2 weights, 1 broadcast

// The blocks of rows, (first row, rows), as lane_rows lays x out and panel_tile computes: blocks of 6; with
// 7 or 8 rows left, 4 + 3 or 4 + 4 (a block of 1 or 2 rows keeps the FMAs waiting on loads).
using RowBlocks = std::vector<std::pair<int64_t, int64_t>>;

inline RowBlocks row_blocks(int64_t m_size) {
  RowBlocks blocks;
  int64_t m = 0;
  for (; m_size - m >= kPanelRowsMax; m += kPanelRowsMax) {
    if (m_size - m == kPanelRowsMax + 1 || m_size - m == kPanelRowsMax + 2) break;
    blocks.emplace_back(m, kPanelRowsMax);
  }
  if (m_size - m > kPanelRowsMax) {
    blocks.emplace_back(m, 4);
    m += 4;
  }
  if (m < m_size) blocks.emplace_back(m, m_size - m);
  return blocks;
}

// one 256-bit load of 16 bfloat16: the 8 even elements and the 8 odd ones as float32
inline void split_bf16(__m256i raw, __m256& even, __m256& odd) {
  even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// count (<= 16) bfloat16 at src in one 256-bit register, zero past count (the zero-padded end of a row)
inline __m256i load_chunk(const uint16_t* src, int64_t count) {
  if (count >= kChunk) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  alignas(32) uint16_t buf[kChunk] = {};
  if (count > 0) std::memcpy(buf, src, static_cast<size_t>(count) * sizeof(uint16_t));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}

// 8 float32 vectors (rows) -> their transpose: out[l] holds lane l of v[0], ..., v[7].
inline void transpose8(const __m256* v, __m256* out) {
  const __m256 a0 = _mm256_unpacklo_ps(v[0], v[1]), a1 = _mm256_unpackhi_ps(v[0], v[1]);
  const __m256 a2 = _mm256_unpacklo_ps(v[2], v[3]), a3 = _mm256_unpackhi_ps(v[2], v[3]);
  const __m256 a4 = _mm256_unpacklo_ps(v[4], v[5]), a5 = _mm256_unpackhi_ps(v[4], v[5]);
  const __m256 a6 = _mm256_unpacklo_ps(v[6], v[7]), a7 = _mm256_unpackhi_ps(v[6], v[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
  const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
  const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
  const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
  out[0] = _mm256_permute2f128_ps(b0, b4, 0x20);
  out[1] = _mm256_permute2f128_ps(b1, b5, 0x20);
  out[2] = _mm256_permute2f128_ps(b2, b6, 0x20);
  out[3] = _mm256_permute2f128_ps(b3, b7, 0x20);
  out[4] = _mm256_permute2f128_ps(b0, b4, 0x31);
  out[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
  out[6] = _mm256_permute2f128_ps(b2, b6, 0x31);
  out[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
}

// x [M, K] bfloat16 -> the blocks of row_blocks(M), a block of R rows [8 lanes][t_size][R] float32: lane l's
// operands in chain order (zero past K), a step's R rows side by side (one line for the block's broadcasts,
// and no rows a multiple of 4 KiB apart competing for one set of L1).
inline void lane_rows(const uint16_t* x, int64_t m_size, int64_t k_size, int64_t kp, const RowBlocks& blocks,
                      float* xl) {
  const int64_t t_size = kp / kLanes, chunks = kp / kChunk;
  const int64_t count = static_cast<int64_t>(blocks.size());
  const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads()) if (m_size * kp > (1 << 16))
  for (int64_t block = 0; block < count; ++block) {
    const int64_t m0 = blocks[block].first, rows = blocks[block].second;
    float* dst = xl + m0 * kp;
    for (int64_t j = 0; j < chunks; ++j) {
      __m256 even[8], odd[8];
      for (int64_t r = 0; r < 8; ++r)  // rows past the block: zeros
        split_bf16(load_chunk(x + (m0 + r) * k_size + j * kChunk, r < rows ? k_size - j * kChunk : 0), even[r],
                   odd[r]);
      __m256 lanes[2][8];  // [e][l]: lane l's step 2j + e for rows 0-7 (those past the block are zeros)
      transpose8(even, lanes[0]);
      transpose8(odd, lanes[1]);
      for (int64_t l = 0; l < kLanes; ++l)
        for (int64_t e = 0; e < 2; ++e) {
          float* at = dst + (l * t_size + 2 * j + e) * rows;
          if (rows == kPanelRowsMax) {
            _mm256_maskstore_ps(at, six, lanes[e][l]);
          } else {
            alignas(32) float v[8];
            _mm256_store_ps(v, lanes[e][l]);
            std::memcpy(at, v, static_cast<size_t>(rows) * sizeof(float));
          }
        }
    }
  }
}

// A block of R rows (lane_rows' layout) against one panel (float32 or bfloat16): per lane, 2 R chains over
// t_size steps, after its share of pf_lines prefetches; then reduce8's tree across the lanes, for the first
// cols columns into y (row r at y + r * ldy).
template <int R, typename W>
inline void panel_block(const W* wl, const float* xl, int64_t kp, float* y, int64_t ldy, int64_t cols,
                        const char* pf = nullptr, int64_t pf_lines = 0) {
  const int64_t t_size = kp / kLanes;
  alignas(32) float part[kLanes][R][kPanel];
  for (int64_t l = 0; l < kLanes; ++l) {
    for (int64_t i = l * pf_lines / kLanes; i < (l + 1) * pf_lines / kLanes; ++i)
      _mm_prefetch(pf + i * 64, _MM_HINT_T0);
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const W* wp = wl + l * t_size * kPanel;
    const float* xp = xl + l * t_size * R;
    for (int64_t t = 0; t < t_size; ++t) {
      __m256 w0, w1;
      if constexpr (std::is_same_v<W, float>) {
        w0 = _mm256_load_ps(wp + t * kPanel);
        w1 = _mm256_load_ps(wp + t * kPanel + 8);
      } else {  // bfloat16 panels: columns 0-7 in the even halves, 8-15 in the odd ones
        const __m256i raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * kPanel));
        w0 = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
        w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(raw, 16), 16));  // no mask register
      }
      for (int r = 0; r < R; ++r) {
        const __m256 b = _mm256_broadcast_ss(xp + t * R + r);
        acc[r][0] = _mm256_fmadd_ps(b, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(b, w1, acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(part[l][r], acc[r][0]);
      _mm256_store_ps(part[l][r] + 8, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[kPanel];
    for (int h = 0; h < kPanel; h += 8) {
      __m256 v[kLanes];
      for (int l = 0; l < kLanes; ++l) v[l] = _mm256_load_ps(part[l][r] + h);
      const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])),
                                     _mm256_add_ps(_mm256_add_ps(v[4], v[5]), _mm256_add_ps(v[6], v[7])));
      if (cols >= kPanel)
        _mm256_storeu_ps(y + r * ldy + h, s);
      else
        _mm256_store_ps(out + h, s);
    }
    if (cols < kPanel) std::memcpy(y + r * ldy, out, static_cast<size_t>(cols) * sizeof(float));
  }
}

// Every row of xl against a tile's panels, block by block of `blocks` (row_blocks(M), as lane_rows laid x
// out) over each panel (a block's x stays in L1 across the panels, the panels in L2 across the blocks).
// Meanwhile the next tile's pf_bytes of weights at pf are prefetched, a share in every lane of every block, so
// that they come from memory while this one computes.
template <typename W>
inline void panel_tile(const W* wl, const float* xl, const RowBlocks& blocks, int64_t kp, float* y, int64_t ldy,
                       int64_t cols, const char* pf, int64_t pf_bytes) {
  const int64_t panels = (cols + kPanel - 1) / kPanel, panel_size = kp * kPanel;
  const int64_t calls = static_cast<int64_t>(blocks.size()) * panels;
  const int64_t lines = pf ? (pf_bytes + 63) / 64 : 0, per_call = (lines + calls - 1) / calls;
  int64_t line = 0;
  const auto rows = [&](auto one, int64_t m) {
    constexpr int R = decltype(one)::value;
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t first = std::min(lines, line), stop = std::min(lines, line + per_call);
      panel_block<R>(wl + p * panel_size, xl + m * kp, kp, y + m * ldy + p * kPanel, ldy, cols - p * kPanel,
                     pf + first * 64, stop - first);
      line = stop;
    }
  };
  for (const auto& [m, size] : blocks) {
    switch (size) {
      case 6: rows(std::integral_constant<int, 6>{}, m); break;
      case 5: rows(std::integral_constant<int, 5>{}, m); break;
      case 4: rows(std::integral_constant<int, 4>{}, m); break;
      case 3: rows(std::integral_constant<int, 3>{}, m); break;
      case 2: rows(std::integral_constant<int, 2>{}, m); break;
      default: rows(std::integral_constant<int, 1>{}, m); break;
    }
  }
}

// Threads over the columns [0, n_size) in tiles of up to 3 panels (the largest that splits the panels evenly
// among the threads): run(n0, cols, next_n0, next_cols) for each, with the tile this thread computes next
// (next_cols = 0: none). Tiles go to whichever thread asks next (the two cores' speeds differ from minute to
// minute); a thread takes its next tile before computing this one, so that it can prefetch its weights.
template <typename Run>
inline void over_tiles(int64_t n_size, const Run& run) {
  const int threads = at::get_num_threads();
  const int64_t panels = (n_size + kPanel - 1) / kPanel;
  int64_t tile_panels = 3;
  for (int64_t p = 3; p >= 1; --p)
    if ((panels + p - 1) / p % threads == 0) {
      tile_panels = p;
      break;
    }
  const int64_t tile = tile_panels * kPanel, tiles = (n_size + tile - 1) / tile;
  std::atomic<int64_t> next_tile{0};
#pragma omp parallel num_threads(threads)
  for (int64_t t = next_tile++; t < tiles;) {
    const int64_t after = next_tile++;
    const int64_t next_n0 = after < tiles ? after * tile : 0;
    run(t * tile, std::min(tile, n_size - t * tile), next_n0, after < tiles ? std::min(tile, n_size - next_n0) : 0);
    t = after;
  }
}

}  // namespace specdec_lanes
