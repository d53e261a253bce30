// Kind 4 (u4r: `int4`) of the AVX512 quantized linear: 4-bit quants q (0..15) per group of 32 with an integer
// multiplier a and offset c per group and one float scale s per column, x quantized once per row
// (quantization/reference.py, kind "u4r"). Included by avx512_vnni_quant_linear.cpp.
//
// Why: with a float scale per group, every (row, column, block) ends in a float chain, and that chain, not
// the memory, bounded verification's 8-16 rows (16 rows of the LM head cost 4.2x one). With integer a and c,
// a row's sum over all of k is exact in int32,
//     isum = sum over blocks of (a * (q . qx) - c * sxq),   y = float(isum) * (s * dx)
// (sxq: the block's sum of qx), so any way of computing the integer gives the same bits:
//   - VNNI (few rows, memory-bound): per block, vpdpbusd sums q . qx (q unsigned, qx signed), then a * that in
//     int32; per pair of blocks one vpdpwssd adds -c . (sxq_b, sxq_b+1) for 16 columns.
//   - AMX-INT8 (from kAmxFrom rows): each column tile's weights are unpacked once per call into a B operand
//     of unsigned bytes a * q (a <= 16, quantize_int4's INT4_LEVELS, so a * q <= 240; QuantizedWeight refuses
//     larger a), which TDPBSUD multiplies with 16 rows at a time, summing over all of k in a C tile; then the
//     same vpdpwssd for c. The unpacking is paid once for every row of the call: 16 rows cost about 2.0x one
//     on the LM head and on the layers (a float chain per group, before integer a, cost 3.9x and 4.5x;
//     docs/quantization-runs.md).
// Bounds: weight_quantizers.int4_levels keeps |sum of (a q - c) qx| and every partial sum below 2^31.
// Layout: quants as kind 1 (u4: [tiles][blocks][4][16][4], the high nibbles groups 4-7), scales one per
// column [tiles][16], mins empty or x's per-channel multipliers [K] (SmoothQuant), sub_scales int16
// [tiles][pairs][64]: per pair of blocks -c of both per column ([16][2]), then a of each ([16] and [16])
// (quantized_weight._u4r_integers).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "avx512_quant_blocks.h"
#include "avx512_w8a8_rows.h"
#include "quant_linear_args.h"
#ifdef SPECDEC_AMX_INT8
#include "amx_tiles.h"
#endif

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

namespace specdec_u4r {

using specdec_quant512::kBlock;
using specdec_quant512::kTile;
using specdec_quant512::load;
using specdec_quant512::load_scales;
using specdec_quant512::unpack_nibbles;
using specdec_w8a8::RowActivations;

constexpr int64_t kIntsPerPair = 64;  // int16 per tile and pair of blocks: -c [16][2], a [16], a [16]

inline int64_t pairs_of(int64_t k_size) { return (k_size / kBlock + 1) / 2; }

// Row m's sums of qx per block, two blocks to a word (sxq_b in the low half, sxq_b+1 in the high one; |sxq| <=
// 32 * 127 fits int16), as vpdpwssd pairs them with -c. An odd last block is paired with 0.
inline void pair_sums(const RowActivations& a, int64_t m, int32_t* out) {
  const int8_t* qr = a.q.data() + m * a.k;
  const int64_t blocks = a.k / kBlock, pairs = pairs_of(a.k);
  for (int64_t p = 0; p < pairs; ++p) {
    int32_t lo = 0, hi = 0;
    for (int i = 0; i < kBlock; ++i) lo += qr[2 * p * kBlock + i];
    if (2 * p + 1 < blocks)
      for (int i = 0; i < kBlock; ++i) hi += qr[(2 * p + 1) * kBlock + i];
    out[p] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                  (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
  }
}

// 16 outputs of one row from its exact sum: float(isum) * (s * dx), the reference's two roundings
inline __m512 outputs(__m512i isum, __m512 sv, float dx) { return specdec_w8a8::outputs(isum, sv, dx); }

// VNNI: rows [row0, row0 + rows) against one tile (16 columns), their int32 sums in `acc` [rows][16] across
// the blocks (each block's 8 weight vectors unpacked once and fed to every row), then out [rows][16].
template <typename S>
void tile_rows_vnni(const uint8_t* w, const int16_t* ints, const S* s, const RowActivations& a, const int32_t* sxp,
                    int64_t row0, int64_t rows, int32_t* acc, float* out) {
  const int64_t blocks = a.k / kBlock, pairs = pairs_of(a.k);
  for (int64_t r = 0; r < rows; ++r) _mm512_store_si512(acc + 16 * r, _mm512_setzero_si512());
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * kTile * kBlock / 2;
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb) + 1024 + 64 * l, _MM_HINT_T0);
    __m512i wv[8];
    unpack_nibbles(wb, wv);
    const int16_t* ip = ints + (b / 2) * kIntsPerPair;
    const __m512i av = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ip + 32 + 16 * (b & 1))));
    const bool pair_end = (b & 1) || b + 1 == blocks;
    const __m512i neg_c = load(ip);
    for (int64_t r = 0; r < rows; ++r) {
      const int8_t* xr = a.q.data() + (row0 + r) * a.k + b * kBlock;
      __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
      for (int g = 0; g < 4; ++g) {
        int32_t v0, v1;
        std::memcpy(&v0, xr + 4 * g, 4);
        std::memcpy(&v1, xr + 16 + 4 * g, 4);
        lo = _mm512_dpbusd_epi32(lo, wv[g], _mm512_set1_epi32(v0));
        hi = _mm512_dpbusd_epi32(hi, wv[g + 4], _mm512_set1_epi32(v1));
      }
      __m512i t = _mm512_add_epi32(_mm512_load_si512(acc + 16 * r), _mm512_mullo_epi32(av, _mm512_add_epi32(lo, hi)));
      if (pair_end) t = _mm512_dpwssd_epi32(t, neg_c, _mm512_set1_epi32(sxp[(row0 + r) * pairs + b / 2]));
      _mm512_store_si512(acc + 16 * r, t);
    }
  }
  const __m512 sv = load_scales(s);
  for (int64_t r = 0; r < rows; ++r)
    _mm512_store_ps(out + 16 * r, outputs(_mm512_load_si512(acc + 16 * r), sv, a.dx[row0 + r]));
}

#ifdef SPECDEC_AMX_INT8
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8")

// Rows from which a call runs on AMX: below, the VNNI loop's per-row work costs less than unpacking every
// weight into the B operand. Measured on a 2-core Xeon (ms, the LM head + the 18 layers' linears, VNNI / AMX):
// 5 rows 2.80 + 2.91 / 2.85 + 3.24, 6 rows 3.39 + 3.21 / 2.88 + 3.24, 8 rows 4.24 + 3.88 / 2.96 + 3.45, 16 rows
// 7.58 + 6.60 / 3.44 + 4.15.
#ifndef U4R_AMX_FROM
#define U4R_AMX_FROM 6
#endif
constexpr int64_t kAmxFrom = U4R_AMX_FROM;

// Whether a call of m_size rows runs on AMX (the tiles take k in steps of 64)
inline bool amx_rows(int64_t m_size, int64_t k_size) {
  return m_size >= kAmxFrom && k_size % 64 == 0 && specdec_amx::amx_permitted();
}

// One column tile's weights, blocks [b0, b1), as the B operand a * q ([blocks][8 groups][16 columns][4] bytes;
// two consecutive blocks are one B tile): a 16-bit multiply of a column's two bytes by its a gives both
// products at once, as a * q <= 240 never carries into the next byte. (With a up to 255, split into nibbles
// for two B operands, unpacking took six instructions a vector instead of one, and a 16-row call cost 2.3x
// one on the LM head instead of 2.0x.)
inline void b_operand(const uint8_t* w, const int16_t* ints, int64_t b0, int64_t b1, uint8_t* bq) {
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = w + b * kTile * kBlock / 2;
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb) + 2048 + 64 * l, _MM_HINT_T0);
    __m512i wv[8];
    unpack_nibbles(wb, wv);
    const __m512i a32 = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ints + (b / 2) * kIntsPerPair + 32 + 16 * (b & 1))));
    const __m512i aw = _mm512_or_si512(a32, _mm512_slli_epi32(a32, 16));  // a in both 16-bit halves of lane c
    for (int g = 0; g < 8; ++g) _mm512_store_si512(bq + b * 512 + g * 64, _mm512_mullo_epi16(wv[g], aw));
  }
}

// Row tiles tile0 and (n == 2) tile0 + 1 against one column tile's B operand: tiles 0 / 1 take their sums, 4
// is B, 6 / 7 A. Then per row the offsets' vpdpwssd per pair of blocks, and the outputs. With `w` (the first
// pass over a column tile), each 64 k of B is unpacked just before its tile multiplies, so that the vector
// unit unpacks the next while the tile unit multiplies (unpacking the whole tile first, then multiplying,
// cost the sum of both). (Alternating two sets of sum tiles, so that consecutive products do not wait on each
// other, made 16 rows twice as slow here.)
template <typename S>
void tile_rows_amx(const uint8_t* w, uint8_t* bq, const int16_t* ints, const S* s, const RowActivations& a,
                   const int32_t* sxp, int64_t tile0, int64_t n, const specdec_quant::OutputRows& y, int64_t col0) {
  const int64_t steps = a.k / 64, lda = a.k, pairs = pairs_of(a.k);
  const int8_t* x0 = a.q.data() + tile0 * 16 * lda;
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t kk = 0; kk < steps; ++kk) {
    if (w != nullptr) b_operand(w, ints, 2 * kk, 2 * kk + 2, bq);
    _tile_loadd(4, bq + kk * 1024, 64);
    _tile_loadd(6, x0 + kk * 64, lda);
    _tile_dpbsud(0, 6, 4);
    if (n > 1) {
      _tile_loadd(7, x0 + 16 * lda + kk * 64, lda);
      _tile_dpbsud(1, 7, 4);
    }
  }
  alignas(64) int32_t c[2][256];
  alignas(64) float out[16];
  _tile_stored(0, c[0], 64);
  if (n > 1) _tile_stored(1, c[1], 64);
  const __m512 sv = load_scales(s);
  for (int64_t j = 0; j < n; ++j) {
    // the row tile's 16 sums in registers, the offsets added pair by pair: each pair's -c loaded once for 16
    // rows, each row's word broadcast from memory into the vpdpwssd (rows past m read sxp's zero padding)
    const int64_t row0 = (tile0 + j) * 16;
    __m512i t[16];
    for (int r = 0; r < 16; ++r) t[r] = _mm512_load_si512(c[j] + 16 * r);
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512i neg_c = load(ints + p * kIntsPerPair);
      const int32_t* sx = sxp + row0 * pairs + p;
      for (int r = 0; r < 16; ++r) t[r] = _mm512_dpwssd_epi32(t[r], neg_c, _mm512_set1_epi32(sx[r * pairs]));
    }
    for (int r = 0; r < 16 && row0 + r < a.m; ++r) {
      _mm512_store_ps(out, outputs(t[r], sv, a.dx[row0 + r]));
      y.store(row0 + r, col0, out, kTile);
    }
  }
}

#pragma GCC pop_options
#endif

// Every tile against every row of x into y; the threads split the column tiles. S: the scales' type.
template <typename S>
void run_rows(const float* x, const float* act, int64_t m_size, int64_t k_size, const S* sp, const at::Tensor& quants,
              const int16_t* ints, const specdec_quant::OutputRows& y) {
  // buffers reused from call to call; the OpenMP threads read the calling thread's through these references
  static thread_local RowActivations reused;
  static thread_local std::vector<int32_t> reused_sums;
  RowActivations& a = reused;
  specdec_w8a8::shape_rows(m_size, k_size, a);
  const int64_t pairs = pairs_of(k_size);
  std::vector<int32_t>& sxp = reused_sums;
  sxp.assign(a.rows_padded * pairs, 0);  // zero past m: the AMX path's last row tile reads 16 rows
  const int64_t tiles = quants.size(0), blocks = k_size / kBlock, tile_bytes = blocks * kTile * kBlock / 2;
  const int64_t tile_ints = pairs * kIntsPerPair;
  const auto* qp = static_cast<const uint8_t*>(quants.data_ptr());
  // a few rows on the calling thread: a parallel region's start costs about what quantizing one row does
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads()) if (m_size > 4)
  for (int64_t m = 0; m < m_size; ++m) {
    specdec_w8a8::quantize_row(x, act, m, a);
    pair_sums(a, m, sxp.data() + m * pairs);
  }
#ifdef SPECDEC_AMX_INT8
  if (amx_rows(m_size, k_size)) {
    const int64_t row_tiles = a.rows_padded / 16;
#pragma omp parallel num_threads(at::get_num_threads())
    {
      static thread_local std::vector<uint8_t> scratch;  // this thread's B operand
      scratch.resize(k_size * kTile + 64);
      uint8_t* bq = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
      specdec_amx::ThreadTiles tile_state(specdec_amx::bf16_tile_config());
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tiles; ++t)
        for (int64_t g = 0; g < row_tiles; g += 2)  // the first pass unpacks the weights, the others reuse them
          tile_rows_amx(g == 0 ? qp + t * tile_bytes : nullptr, bq, ints + t * tile_ints, sp + t * kTile, a,
                        sxp.data(), g, std::min<int64_t>(2, row_tiles - g), y, t * kTile);
    }
    return;
  }
#endif
  constexpr int64_t kRows = 64;  // rows per pass over a tile (their sums and outputs stay in L1)
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t t = 0; t < tiles; ++t) {
    alignas(64) int32_t acc[kRows * kTile];
    alignas(64) float out[kRows * kTile];
    for (int64_t row0 = 0; row0 < m_size; row0 += kRows) {
      const int64_t rows = std::min(kRows, m_size - row0);
      tile_rows_vnni(qp + t * tile_bytes, ints + t * tile_ints, sp + t * kTile, a, sxp.data(), row0, rows, acc, out);
      for (int64_t r = 0; r < rows; ++r) y.store(row0 + r, t * kTile, out + r * kTile, kTile);
    }
  }
}

}  // namespace specdec_u4r

#pragma GCC pop_options
