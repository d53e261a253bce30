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
// Layout: A is 16 slots of the keys stored slot-major (kv_cache.py's tile layout on the AMX build; a
// plain-layout cache's keys are laid out so first), B the query rows in pairs of dims (pack_x's layout):
// C holds 16 slots x 16 query rows.
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

// The query rows (float32 holding bfloat16 values, so exact) as bfloat16 into `out`.
inline void query_bf16(const float* q, int64_t rows, int64_t dim, std::vector<uint16_t>& out) {
  out.resize(static_cast<size_t>(rows * dim));
  for (int64_t i = 0; i < rows * dim; ++i) {
    uint32_t bits;
    std::memcpy(&bits, q + i, 4);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
}

}  // namespace

// `rows` float32 query rows (bfloat16 values; stride dim) against the keys of one head stored slot-major
// (keys_rows [capacity, dim]: kv_cache.py's tile layout on the AMX build; `krows` the span's first slot,
// `readable` the slots readable from it), slots [s0, s1) into out's columns [s0, s1) (row stride ldo). The
// keys are the A operand, loaded as stored, and the query rows the B operand (packed once per call, as
// pack_x), so no key is repacked: a decode step's four query rows cost about a third of the FMA loop's time.
// A tile past the buffer reads a zero-padded copy. False (nothing written) where it does not apply: dim not
// a multiple of 32, or no AMX tile state from the OS.
bool amx_score_rows(const float* q, int64_t rows, const uint16_t* krows, int64_t readable, int64_t dim, float* out,
                    int64_t ldo, int64_t s0, int64_t s1) {
  if (dim % kTileK != 0 || rows <= 0 || !specdec_amx::amx_permitted()) return false;
  if (s1 <= s0) return true;
  const int64_t k_tiles = dim / kTileK, m_tiles = (rows + 15) / 16;
  static thread_local std::vector<uint16_t> qb;
  static thread_local std::vector<uint16_t> tail;  // 32 slots' keys where a tile would read past the buffer
  query_bf16(q, rows, dim, qb);
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

// score_span's contract for the cache's plain layout (keys transposed, [dim, stride]): the span's keys laid
// out slot-major in a copy, then amx_score_rows (decoder.attention's qk_scores and attention_batch's tensor
// path; the AMX build's own cache needs no copy). The same products in the same order: the same bits.
bool amx_score_span(const float* q, int64_t rows, const uint16_t* keys, int64_t dim, int64_t stride, float* out,
                    int64_t ldo, int64_t s0, int64_t s1) {
  if (dim % kTileK != 0 || rows <= 0 || !specdec_amx::amx_permitted()) return false;
  if (s1 <= s0) return true;
  static thread_local std::vector<uint16_t> krows;  // [s1 - s0][dim]
  krows.resize(static_cast<size_t>((s1 - s0) * dim));
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t s = s0; s < s1; ++s) krows[(s - s0) * dim + d] = keys[d * stride + s];
  return amx_score_rows(q, rows, krows.data(), s1 - s0, dim, out + s0, ldo, 0, s1 - s0);
}

#pragma GCC pop_options
