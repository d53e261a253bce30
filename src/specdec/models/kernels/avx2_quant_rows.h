// Kinds 3 (s8r: `w8a8_int8`) and 4 (u4r: `int4`) of the AVX2 quantized linear: x quantized once per row, so
// each output is one exact int32 sum over the row and one float product (quantization/reference.py),
//     s8r: isum = q . qx                                            y = float(isum) * (s * dx)
//     u4r: isum = sum over blocks of a * (q . qx) - c * sum(qx)    (the same product)
// the bits of the AVX512 builds' avx512_w8a8_rows.h and avx512_u4r_rows.h, on CPUs without AVX512 (before,
// these kinds ran in the torch reference there: the same bits, about 80 times slower).
// Integer products as the other AVX2 kinds do them (avx2_quant_linear.cpp): s8r's by maddubs of |qx| and
// q with qx's sign (pairs up to 2 * 127 * 127), u4r's by maddubs of q (0..15) and qx, 8 groups added in int16
// (up to 30480), then one madd by the block's multiplier a to int32; u4r's offsets per pair of blocks by one
// madd of -c with the two blocks' sums of qx. Rows in blocks of up to 4 against one 8-column tile; threads
// split the tiles only.
// Layout: tiles of 8 columns, as the other kinds; scales one per column [tiles][8]; u4r's integers int16
// [tiles][pairs][32]: -c of both blocks per column ([8][2]), then a of each ([8] and [8]).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_linear_args.h"

namespace specdec_rows2 {

constexpr int64_t kBlock = 32;
constexpr int64_t kTile = 8;
constexpr int64_t kIntsPerPair = 32;  // int16 per tile and pair of blocks (u4r): -c [8][2], a [8], a [8]

// x quantized per row: q and |q| [m][k], the row's scale (NaN where a value is not finite: every output of
// the row NaN, as in the reference), and each block's sum of q [m][blocks]
struct RowQuant {
  std::vector<int8_t> q, absq;
  std::vector<float> dx;
  std::vector<int32_t> sums;
  std::vector<int32_t> pair_sums;  // [m][pairs] u4r's: blocks 2p and 2p + 1's sums as int16 halves (lo, hi)
  int64_t m = 0, k = 0, blocks = 0;
};

// Row m as reference.quantize_activations(x * act, per_row=True): d = max|x| / 127, q = round-half-even(x / d)
inline void quantize_row(const float* x, const float* act, int64_t m, RowQuant& a) {
  const float* xr = x + m * a.k;
  int8_t* q = a.q.data() + m * a.k;
  int8_t* aq = a.absq.data() + m * a.k;
  int32_t* sums = a.sums.data() + m * a.blocks;
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < a.k; ++i) {
    const float v = act == nullptr ? xr[i] : xr[i] * act[i];
    finite = finite && std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  if (!finite) {
    std::memset(q, 0, a.k);
    std::memset(aq, 0, a.k);
    std::fill(sums, sums + a.blocks, 0);
    a.dx[m] = specdec_quant::kNaN;
    return;
  }
  const float d = amax / 127.0f;
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  for (int64_t b = 0; b < a.blocks; ++b) {
    int32_t sum = 0;
    for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
      const float v = act == nullptr ? xr[i] : xr[i] * act[i];
      const int32_t r = static_cast<int32_t>(std::nearbyint(v * inv));
      q[i] = static_cast<int8_t>(r);
      aq[i] = static_cast<int8_t>(r < 0 ? -r : r);
      sum += r;
    }
    sums[b] = sum;
  }
  a.dx[m] = d;
}

// Row m's pair sums from its block sums (a missing last block's sum 0)
inline void pack_pair_sums(int64_t m, RowQuant& a) {
  const int64_t pairs = (a.blocks + 1) / 2;
  const int32_t* sums = a.sums.data() + m * a.blocks;
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t lo = sums[2 * p], hi = 2 * p + 1 < a.blocks ? sums[2 * p + 1] : 0;
    a.pair_sums[m * pairs + p] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                                      (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
  }
}

inline __m256 load_scales(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_scales(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// The R rows' 8 outputs from their sums: float(isum) * (s * dx)
template <int R, typename S>
void store_rows(const __m256i* isum, const S* s, const RowQuant& a, int64_t row0, const specdec_quant::OutputRows& y,
                int64_t col) {
  const __m256 sv = load_scales(s);
  alignas(32) float v[kTile];
  for (int r = 0; r < R; ++r) {
    const __m256 t = _mm256_mul_ps(sv, _mm256_set1_ps(a.dx[row0 + r]));
    _mm256_store_ps(v, _mm256_mul_ps(_mm256_cvtepi32_ps(isum[r]), t));
    y.store(row0 + r, col, v, kTile);
  }
}

// R rows against one tile of s8 weights ([blocks][8 groups][8 columns][4 bytes]), one sum over all of k
template <int R, typename S>
void tile_s8r(const int8_t* w, const S* s, const RowQuant& a, int64_t row0, const specdec_quant::OutputRows& y,
              int64_t col) {
  __m256i acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int8_t* wb = w + b * kTile * kBlock;
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb + 1024 + 64 * l), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = a.q.data() + (row0 + r) * a.k + b * kBlock;
      const int8_t* xa = a.absq.data() + (row0 + r) * a.k + b * kBlock;
      for (int g = 0; g < 8; ++g) {
        int32_t xg, ag;
        std::memcpy(&xg, xq + 4 * g, 4);
        std::memcpy(&ag, xa + 4 * g, 4);
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * kBlock));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(
            _mm256_set1_epi32(ag), _mm256_sign_epi8(wv, _mm256_set1_epi32(xg))), ones));
      }
    }
  }
  store_rows<R>(acc, s, a, row0, y, col);
}

// One block b of u4r weights (u4's nibbles: [4][8 columns][4 bytes], the low nibbles groups 0-3, the high
// ones 4-7) against R rows: per row the 8 groups' products added in int16 (up to 30480), then one madd by the
// block's multiplier a to int32. Groups outside, rows inside: one unpacked vector serves every row. The empty
// asm pins each row's sum to a register at its step: without it GCC computed every product first and spilled
// them (with the sums kept on the stack, 1.4x slower at 8-16 rows on the 2-core EPYC).
template <int R>
inline void block_u4r(const uint8_t* wb, __m256i a_pair, const int8_t* x, int64_t k, __m256i* acc) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i sum16[R];
  for (int h = 0; h < 4; ++h) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + h * kBlock));
    const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    for (int r = 0; r < R; ++r) {
      int32_t xl, xh;
      std::memcpy(&xl, x + r * k + 4 * h, 4);
      std::memcpy(&xh, x + r * k + 4 * (h + 4), 4);
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)),
                                         _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
      sum16[r] = h == 0 ? p : _mm256_add_epi16(sum16[r], p);
      asm volatile("" : "+x"(sum16[r]));
    }
  }
  for (int r = 0; r < R; ++r) acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(sum16[r], a_pair));
}

// column c's a of block b in both int16 halves of lane c: madd(sum16, a_pair) = a * (lo + hi), the same int32
// as a * madd(sum16, ones) (exact for any int16 a: 32768 * 30480 * 2 < 2^31) without a vpmulld, whose two
// uops take the multiply pipe that the maddubs keep busy
inline __m256i multipliers(const int16_t* ip, int64_t b) {
  const __m256i a32 = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ip + 16 + 8 * (b & 1))));
  return _mm256_or_si256(a32, _mm256_slli_epi32(a32, 16));
}

// R rows against one tile of u4r weights and its integers, a pair of blocks at a time: the blocks' products,
// then -c_b sxq_b - c_b+1 sxq_b+1 per column by one madd with the row's packed pair sums (|sxq| <= 32 * 127
// fits int16). Integer sums only, exact in any order: the same int32 as block by block.
template <int R, typename S>
void tile_u4r(const uint8_t* w, const int16_t* ints, const S* s, const RowQuant& a, int64_t row0,
              const specdec_quant::OutputRows& y, int64_t col) {
  __m256i acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
  const int64_t pairs = (a.blocks + 1) / 2;
  const int8_t* x = a.q.data() + row0 * a.k;
  const int32_t* pair_sums = a.pair_sums.data() + row0 * pairs;
  for (int64_t p = 0; p < pairs; ++p) {
    const int16_t* ip = ints + p * kIntsPerPair;
    const uint8_t* wb = w + p * 2 * kTile * kBlock / 2;  // the pair's 256 bytes
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb + 1024 + 64 * l), _MM_HINT_T0);
    block_u4r<R>(wb, multipliers(ip, 0), x + 2 * p * kBlock, a.k, acc);
    if (2 * p + 1 < a.blocks)
      block_u4r<R>(wb + kTile * kBlock / 2, multipliers(ip, 1), x + (2 * p + 1) * kBlock, a.k, acc);
    const __m256i neg_c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ip));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(neg_c, _mm256_set1_epi32(pair_sums[r * pairs + p])));
      asm volatile("" : "+x"(acc[r]));  // in a register: store_rows takes the array's address, and GCC had
    }                                    // kept it on the stack throughout (a store and a load every block)
  }
  __m256i sums[R];
  for (int r = 0; r < R; ++r) sums[r] = acc[r];
  store_rows<R>(sums, s, a, row0, y, col);
}

// Every tile against every row of x into y (kind 3: s8r, 4: u4r); `ints` u4r's integers
template <typename S>
void run_rows(const float* x, const float* act, int64_t m_size, int64_t k_size, const S* sp, const at::Tensor& quants,
              const int16_t* ints, int64_t kind, const specdec_quant::OutputRows& y) {
  // reused from call to call (prefill's rows would make fresh buffers an mmap and page faults); the OpenMP
  // threads read the calling thread's through this reference
  static thread_local RowQuant reused;
  RowQuant& a = reused;
  a.m = m_size;
  a.k = k_size;
  a.blocks = k_size / kBlock;
  a.q.assign(m_size * k_size, 0);
  a.absq.assign(m_size * k_size, 0);
  a.dx.assign(m_size, 0.0f);
  a.sums.assign(m_size * a.blocks, 0);
  const int64_t tiles = quants.size(0), pairs = (a.blocks + 1) / 2;
  a.pair_sums.assign(m_size * pairs, 0);
  for (int64_t m = 0; m < m_size; ++m) {
    quantize_row(x, act, m, a);
    pack_pair_sums(m, a);
  }
  const int64_t tile_bytes = kind == 3 ? a.blocks * kTile * kBlock : a.blocks * kTile * kBlock / 2;
  const auto* qp = static_cast<const uint8_t*>(quants.data_ptr());
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t t = 0; t < tiles; ++t) {
    const uint8_t* w = qp + t * tile_bytes;
    const S* s = sp + t * kTile;
    specdec_quant::for_row_blocks(m_size, [&](auto r, int64_t m) {
      constexpr int R = decltype(r)::value;
      if (kind == 3)
        tile_s8r<R>(reinterpret_cast<const int8_t*>(w), s, a, m, y, t * kTile);
      else
        tile_u4r<R>(w, ints + t * pairs * kIntsPerPair, s, a, m, y, t * kTile);
    });
  }
}

}  // namespace specdec_rows2
