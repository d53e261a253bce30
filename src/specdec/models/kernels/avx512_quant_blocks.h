// What the AVX512 quantized-linear loops share (avx512_vnni_quant_linear.cpp, and amx_int8_quant_tiles.h in its
// AMX-INT8 build): the quantized activations' layout and the reading of one 16-column tile's block of weights.
#pragma once

#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")

namespace specdec_quant512 {

constexpr int64_t kBlock = 32;
constexpr int64_t kTile = 16;

// x quantized, block-major: a block's rows lie side by side, so the rows sharing a weight block are read
// at fixed offsets from one pointer (m: the rows of the layout, which may exceed x's, zero-filled).
struct Activations {
  const int8_t* q;   // [blocks][m][32]
  const int32_t* c;  // [blocks][m][2] -128 * sum(q) over the block's first and second 16 k
  const float* dx;   // [blocks][m]
  const float* sx;   // [blocks][m] dx * float(sum(q))
  int64_t m, blocks;
};

inline __m512i load(const void* p) { return _mm512_loadu_si512(p); }

// 16 scales as float32: float16 ones (a GGUF's own) widen exactly
inline __m512 load_scales(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_scales(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// A u4 block's 8 group vectors from its 4 vectors of nibbles (the low ones group h, the high ones group h + 4)
inline void unpack_nibbles(const uint8_t* wb, __m512i* wv) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int h = 0; h < 4; ++h) {
    const __m512i raw = load(wb + h * 64);
    wv[h] = _mm512_and_si512(raw, low4);
    wv[h + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
  }
}

// An s5 block (u = q + 16 as u4's nibbles, then a plane whose byte (column, j) holds in bit g the fifth bit of
// group g's byte j) as the 8 group vectors of u: bit g of each plane byte to bit 4 (shifts within 16-bit
// lanes: the mask keeps each byte's own bit).
inline void unpack_s5(const uint8_t* wb, __m512i* wv) {
  unpack_nibbles(wb, wv);
  const __m512i bit4 = _mm512_set1_epi8(0x10), plane = load(wb + 4 * 64);
  wv[0] = _mm512_or_si512(wv[0], _mm512_and_si512(_mm512_slli_epi16(plane, 4), bit4));
  wv[1] = _mm512_or_si512(wv[1], _mm512_and_si512(_mm512_slli_epi16(plane, 3), bit4));
  wv[2] = _mm512_or_si512(wv[2], _mm512_and_si512(_mm512_slli_epi16(plane, 2), bit4));
  wv[3] = _mm512_or_si512(wv[3], _mm512_and_si512(_mm512_slli_epi16(plane, 1), bit4));
  wv[4] = _mm512_or_si512(wv[4], _mm512_and_si512(plane, bit4));
  wv[5] = _mm512_or_si512(wv[5], _mm512_and_si512(_mm512_srli_epi16(plane, 1), bit4));
  wv[6] = _mm512_or_si512(wv[6], _mm512_and_si512(_mm512_srli_epi16(plane, 2), bit4));
  wv[7] = _mm512_or_si512(wv[7], _mm512_and_si512(_mm512_srli_epi16(plane, 3), bit4));
}

// Bytes of one tile's block of weights for kind 0 (s8), 1 (u4), 2 (s5)
constexpr int64_t block_bytes(int64_t kind) { return kTile * (kind == 0 ? kBlock : kind == 1 ? kBlock / 2 : 20); }

}  // namespace specdec_quant512

#pragma GCC pop_options
