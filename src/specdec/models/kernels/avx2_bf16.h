// bfloat16 <-> float32 conversions, the 16-lane pairwise sum and the prefetcher shared by the AVX2/AVX512 kernels.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace specdec_bf16 {

inline __m256 load_bf16x8(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// bfloat16 -> float32 of 16 values by one load and two word unpacks against zero: two shuffles where
// load_bf16x8 takes a widening and a shift per 8 (on the EPYC those bound the attention's FMA loops), in the
// unpacks' order: `lo` holds values 0-3 and 8-11, `hi` 4-7 and 12-15 (_mm256_permute2f128_ps puts them back).
inline void load_bf16x16_split(const uint16_t* p, __m256& lo, __m256& hi) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i zero = _mm256_setzero_si256();
  lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw));
  hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw));
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// c10::BFloat16's conversion: round to nearest even, NaN to the quiet NaN
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// 8 float32 -> bfloat16 as float_to_bf16 rounds them (round to nearest even, NaN to 0x7FC0)
inline __m128i to_bf16x8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  // values up to 0xFFFF pack unchanged; packus works per 128-bit half, so quadwords 0 and 2 hold the 8
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

// AVX512 variants of the loops live beside the AVX2 ones in the same files (compiled with -mavx2): they
// enable their ISA per function and run only where has_avx512() says the CPU has it.
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

inline bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

// The pairwise sum of 16 lanes: 8 = l + (l + 8), then 4, 2, 1 (the norm's and the softmax's fixed order)
inline float lane_total(const float* acc) {
  float s8[8], s4[4], s2[2];
  for (int l = 0; l < 8; ++l) s8[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  for (int l = 0; l < 2; ++l) s2[l] = s4[l] + s4[l + 2];
  return s2[0] + s2[1];
}

// 16 float32 -> bfloat16 as float_to_bf16 rounds them (round to nearest even, NaN to 0x7FC0)
SPECDEC_AVX512 inline __m256i to_bf16x16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

SPECDEC_AVX512 inline __m512 load_bf16x16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Software prefetch of the cache lines a later sequence's attention will read, a few lines at a time from
// inside the current sequence's loops (pump), so its DRAM reads overlap this sequence's arithmetic: a batch's
// decode step reads every sequence's keys and values cold, and without it attention waited on memory for
// more than half its time. Regions are `rows` runs of `bytes` bytes, `stride` bytes apart. Reads nothing,
// changes no result.
struct Prefetcher {
  struct Region {
    const char* base = nullptr;
    int64_t bytes = 0, stride = 0, rows = 0;
  };
  Region regions[2];
  int count = 0, region = 0;
  int64_t row = 0, offset = 0;

  void add(const void* base, int64_t bytes, int64_t stride, int64_t rows) {
    if (count < 2 && bytes > 0 && rows > 0) regions[count++] = {static_cast<const char*>(base), bytes, stride, rows};
  }
  // issues up to n line prefetches (into L2: the lines are read once, a while later)
  inline void pump(int n) {
    for (; n > 0 && region < count; --n) {
      const Region& r = regions[region];
      _mm_prefetch(r.base + row * r.stride + offset, _MM_HINT_T1);
      offset += 64;
      if (offset >= r.bytes) {
        offset = 0;
        if (++row == r.rows) row = 0, ++region;
      }
    }
  }
};

}  // namespace specdec_bf16
