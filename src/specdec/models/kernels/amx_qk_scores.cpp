// Attention scores q . k on AMX-BF16 tiles (the AMX build only): avx2_qk_scores.cpp's score_span runs here
// whenever the head dim is a multiple of 32, so every path that scores attention (a decode step, a verified
// chain or tree, a prefill chunk, decoder.attention's qk_scores) gives each score the same bits.
//
// Why: 16 verification rows over a long context, and a prefill chunk's hundreds of rows, were bound by the
// FMA loop (each key widened to float32, one FMA per row, key and 16 slots): at 1.5k tokens of context the
// attention of a 16-row step cost about 4 ms of its 17 (Gemma 3 270M, 2-core Xeon). One TDPBF16PS computes
// 16 rows x 16 slots x 32 dims.
//
// Arithmetic: each score starts at zero and takes one TDPBF16PS per 32 dims, in ascending order, from its own
// query row and key only (bfloat16 products, float32 accumulation as the tile unit does it): the bits
// amx_rows_linear.cpp gives for q @ keys^T, whatever the number of rows, the slots beside it or the
// threads. That is not the FMA chain of the other builds (the tile unit does not round after every
// product), so the AMX build's scores differ from theirs in the last bits, the same way on every path.
// Layout: A is the query rows as bfloat16 (padded to whole 16-row tiles), B a 16-slot block of the cache's
// transposed keys [dim, stride] packed into pairs of dims: row p of a k tile holds, for each of the 16
// slots, (k[2p][s], k[2p + 1][s]) as one 32-bit word; slots past the span are zeros.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_attention_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

namespace {

using specdec_amx::kTileK;

// keys [dim, stride] slots [s, s + n) (n <= 32) into the B tiles of two 16-slot blocks for every k tile:
// block j at b + j * k_tiles * 256, word (kt * 16 + p) * 16 + i = (k[2p][s + 16 j + i], k[2p + 1][s + 16 j + i]).
// Per pair of dims: two loads of 32 slots, vpunpck{l,h}wd (pairs in 128-bit lanes), and two two-source
// permutes that put slots 0-15 and 16-31 back in order.
inline void pack_keys(const uint16_t* keys, int64_t stride, int64_t k_tiles, int64_t s, int64_t n, uint32_t* b) {
  const __mmask32 lanes = n >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << n) - 1);
  const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  uint32_t* b1 = b + k_tiles * 256;
  for (int64_t p = 0; p < k_tiles * 16; ++p) {
    const uint16_t* even = keys + 2 * p * stride + s;
    const __m512i lo = _mm512_maskz_loadu_epi16(lanes, even), hi = _mm512_maskz_loadu_epi16(lanes, even + stride);
    const __m512i x = _mm512_unpacklo_epi16(lo, hi), y = _mm512_unpackhi_epi16(lo, hi);
    // x: slots 0-3, 8-11, 16-19, 24-27 (lanes 0-3); y: 4-7, 12-15, 20-23, 28-31
    _mm512_storeu_si512(b + p * 16, _mm512_permutex2var_epi64(x, first, y));
    _mm512_storeu_si512(b1 + p * 16, _mm512_permutex2var_epi64(x, second, y));
  }
}

// The query rows (float32 holding bfloat16 values, so exact) as bfloat16 into `out`, zero rows after them up
// to `padded` rows.
inline void query_bf16(const float* q, int64_t rows, int64_t padded, int64_t dim, std::vector<uint16_t>& out) {
  out.assign(static_cast<size_t>(padded * dim), 0);
  for (int64_t i = 0; i < rows * dim; ++i) {
    uint32_t bits;
    std::memcpy(&bits, q + i, 4);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
}

// The C tile `c` (16 rows x 16 slots) into out rows [row0, row0 + rows) and slots [s, s + n)
inline void store_scores(int c, float* buf, float* out, int64_t ldo, int64_t row0, int64_t rows, int64_t s, int64_t n) {
  switch (c) {  // the tile index is an immediate
    case 0: _tile_stored(0, buf, 64); break;
    case 1: _tile_stored(1, buf, 64); break;
    case 2: _tile_stored(2, buf, 64); break;
    default: _tile_stored(3, buf, 64); break;
  }
  const __mmask16 lanes = specdec_amx::first_lanes(n);
  for (int64_t r = 0; r < std::min<int64_t>(16, rows - row0); ++r)
    _mm512_mask_storeu_ps(out + (row0 + r) * ldo + s, lanes, _mm512_loadu_ps(buf + 16 * r));
}

}  // namespace

// score_span's contract on AMX tiles: `rows` float32 query rows (bfloat16 values; stride dim) against keys
// [dim, stride], slots [s0, s1) into out's columns [s0, s1) (row stride ldo). False (nothing written) where
// it does not apply: dim not a multiple of 32, or no AMX tile state from the OS.
bool amx_score_span(const float* q, int64_t rows, const uint16_t* keys, int64_t dim, int64_t stride, float* out,
                    int64_t ldo, int64_t s0, int64_t s1) {
  if (dim % kTileK != 0 || rows <= 0 || !specdec_amx::amx_permitted()) return false;
  if (s1 <= s0) return true;
  const int64_t k_tiles = dim / kTileK, m_tiles = (rows + 15) / 16;
  static thread_local std::vector<uint16_t> a;  // the query rows, zero rows to a whole tile
  static thread_local std::vector<uint32_t> b;  // two slot blocks' B tiles
  query_bf16(q, rows, m_tiles * 16, dim, a);
  b.resize(static_cast<size_t>(2 * k_tiles * 256));
  uint32_t* b0 = b.data();
  uint32_t* b1 = b0 + k_tiles * 256;
  const int64_t lda = dim * 2;
  specdec_amx::AttentionTiles tiles;  // 16 rows x 64 bytes: C 0-3, A 4-5, B 6-7
  alignas(64) float buf[256];
  // blocks of 2 row tiles x 2 slot blocks: four C tiles in flight (one accumulating alone waits on itself)
  for (int64_t s = s0; s < s1; s += 32) {
    const int64_t n0 = std::min<int64_t>(16, s1 - s), n1 = std::clamp<int64_t>(s1 - s - 16, 0, 16);
    pack_keys(keys, stride, k_tiles, s, n0 + n1, b0);
    for (int64_t g = 0; g < m_tiles; g += 2) {
      const bool two = g + 1 < m_tiles;
      const uint16_t* a0 = a.data() + g * 16 * dim;
      const uint16_t* a1 = a0 + 16 * dim;
      specdec_amx::zero_accumulators();
      for (int64_t kt = 0; kt < k_tiles; ++kt) {
        _tile_loadd(4, a0 + kt * kTileK, lda);
        _tile_loadd(6, b0 + kt * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (n1 > 0) {
          _tile_loadd(7, b1 + kt * 256, 64);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two) {
          _tile_loadd(5, a1 + kt * kTileK, lda);
          _tile_dpbf16ps(2, 5, 6);
          if (n1 > 0) _tile_dpbf16ps(3, 5, 7);
        }
      }
      store_scores(0, buf, out, ldo, g * 16, rows, s, n0);
      if (n1 > 0) store_scores(1, buf, out, ldo, g * 16, rows, s + 16, n1);
      if (two) {
        store_scores(2, buf, out, ldo, (g + 1) * 16, rows, s, n0);
        if (n1 > 0) store_scores(3, buf, out, ldo, (g + 1) * 16, rows, s + 16, n1);
      }
    }
  }
  return true;
}

// The same scores from the cache's slot-major keys (keys_rows [capacity, dim] of one head: kv_cache.py's
// tile layout on the AMX build): the keys are the A operand, loaded as stored, and the query rows
// the B operand (packed once per call, pack_x), so no key is repacked; a decode step's four query rows cost
// about a third of the FMA loop's time instead of more. Each score takes the same products, 32 dims per
// multiply in the same order, with the operands swapped, which the tile unit sums alike (amx_rows_linear.cpp's
// two forms rely on it; tests/test_attention_batch_kernel.py checks it): the bits are amx_score_span's. `krows` is the
// span's first slot, `readable` the slots readable from it (a tile past the buffer reads a zero-padded copy).
bool amx_score_rows(const float* q, int64_t rows, const uint16_t* krows, int64_t readable, int64_t dim, float* out,
                    int64_t ldo, int64_t s0, int64_t s1) {
  if (dim % kTileK != 0 || rows <= 0 || !specdec_amx::amx_permitted()) return false;
  if (s1 <= s0) return true;
  const int64_t k_tiles = dim / kTileK, m_tiles = (rows + 15) / 16;
  static thread_local std::vector<uint16_t> qb;
  static thread_local std::vector<uint16_t> tail;  // 32 slots' keys where a tile would read past the buffer
  query_bf16(q, rows, rows, dim, qb);
  // B: word ((kt * m_tiles + g) * 16 + p) * 16 + m = (q[16 g + m][32 kt + 2 p], q[..][32 kt + 2 p + 1]), as pack_x
  static thread_local std::vector<uint32_t> b;
  b.assign(static_cast<size_t>(k_tiles * m_tiles * 256), 0);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t pr = 0; pr < dim / 2; ++pr) {
      uint32_t w;
      std::memcpy(&w, qb.data() + m * dim + 2 * pr, 4);
      b[(((pr / 16) * m_tiles + m / 16) * 16 + pr % 16) * 16 + m % 16] = w;
    }
  const int64_t lda = dim * 2;
  specdec_amx::AttentionTiles tiles;  // C 0-3, A 4-5 (two 16-slot blocks), B 6-7 (two 16-row tiles)
  alignas(64) float buf[256];
  auto store = [&](int c, int64_t s, int64_t n, int64_t g) {  // C (16 slots x 16 rows) into out[row][slot]
    switch (c) {
      case 0: _tile_stored(0, buf, 64); break;
      case 1: _tile_stored(1, buf, 64); break;
      case 2: _tile_stored(2, buf, 64); break;
      default: _tile_stored(3, buf, 64); break;
    }
    for (int64_t r = 0; r < std::min<int64_t>(16, rows - 16 * g); ++r)
      for (int64_t i = 0; i < n; ++i) out[(16 * g + r) * ldo + s + i] = buf[16 * i + r];
  };
  for (int64_t s = s0; s < s1; s += 32) {
    const int64_t n0 = std::min<int64_t>(16, s1 - s), n1 = std::clamp<int64_t>(s1 - s - 16, 0, 16);
    const uint16_t* a0 = krows + s * dim;
    if (s + 32 > readable) {  // the last slots of the buffer: a zero-padded copy
      tail.assign(static_cast<size_t>(32 * dim), 0);
      std::memcpy(tail.data(), a0, static_cast<size_t>(std::max<int64_t>(0, readable - s) * dim) * 2);
      a0 = tail.data();
    }
    const uint16_t* a1 = a0 + 16 * dim;
    for (int64_t g = 0; g < m_tiles; g += 2) {
      const bool two = g + 1 < m_tiles;
      const uint32_t* b0 = b.data() + g * 256;
      specdec_amx::zero_accumulators();
      for (int64_t kt = 0; kt < k_tiles; ++kt) {
        _tile_loadd(4, a0 + kt * kTileK, lda);
        _tile_loadd(6, b0 + kt * m_tiles * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (n1 > 0) {
          _tile_loadd(5, a1 + kt * kTileK, lda);
          _tile_dpbf16ps(1, 5, 6);
        }
        if (two) {
          _tile_loadd(7, b0 + kt * m_tiles * 256 + 256, 64);
          _tile_dpbf16ps(2, 4, 7);
          if (n1 > 0) _tile_dpbf16ps(3, 5, 7);
        }
      }
      store(0, s, n0, g);
      if (n1 > 0) store(1, s + 16, n1, g);
      if (two) {
        store(2, s, n0, g + 1);
        if (n1 > 0) store(3, s + 16, n1, g + 1);
      }
    }
  }
  return true;
}

#pragma GCC pop_options
