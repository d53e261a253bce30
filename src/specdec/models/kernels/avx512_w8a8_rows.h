// Kind 3 (s8r: `w8a8_int8`) of the AVX512 quantized linear: int8 weights with one scale per column, and x
// quantized once per row (quantization/reference.py, kind "s8r"). Included by avx512_vnni_quant_linear.cpp.
//
// Why: with x quantized per block of 32, every (row, column, block) ends in a float chain, and that chain,
// not the memory, bounds verification's 8-16 rows. With one scale per row and one per column, a row's
// products are one exact int32 sum over all of k, and each output is one float product at the end:
//     y = float(isum) * (s * dx)
// so AMX-INT8 (TDPBSSD, signed x signed) accumulates a whole row in its C tile and 16 rows cost about what
// one does. The VNNI loop computes the same integers (exact in any order), hence the same bits.
//   - x row-major [m_pad][K] int8, m_pad a multiple of 16 (zero rows past m: the A tiles read whole tiles).
//   - VNNI: vpdpbusd multiplies unsigned by signed bytes, so the weights are read as q + 128 (xor 0x80) and
//     each row's sum starts from c = -128 * sum(qx) over the row, ending at sum(q * qx) exactly.
//   - The int32 sum is bounded by 383 * 127 * K (weight_quantizers.MAX_W8A8_IN_FEATURES keeps K <= 32768).
// x may first be multiplied per channel (SmoothQuant, quantization/smoothing.py: `act`, the mins slot).
// Weights: kind 0's layout ([tiles][blocks][8 groups of 4 k][16 columns][4 bytes]) with per-column scales;
// two consecutive blocks are one AMX B tile (16 rows of 4 k x 16 columns, 64 bytes each).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "avx512_quant_blocks.h"
#include "quant_linear_args.h"
#ifdef SPECDEC_AMX_INT8
#include "amx_tiles.h"
#endif

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

namespace specdec_w8a8 {

using specdec_quant512::kBlock;
using specdec_quant512::kTile;
using specdec_quant512::load;
using specdec_quant512::load_scales;

// x quantized per row (row-major, rows_padded rows, zero past m)
struct RowActivations {
  std::vector<int8_t> q;   // [rows_padded][k]
  std::vector<int32_t> c;  // [m] -128 * sum(q) over the row
  std::vector<float> dx;   // [m] the row's scale (NaN for a row with a non-finite value: all its outputs NaN)
  int64_t m = 0, k = 0, rows_padded = 0;
};

// Sizes a's buffers for m rows of k (zero rows past m, which the A tiles read)
inline void shape_rows(int64_t m_size, int64_t k_size, RowActivations& a) {
  a.m = m_size;
  a.k = k_size;
  a.rows_padded = (m_size + 15) / 16 * 16;
  a.q.assign(a.rows_padded * k_size, 0);
  a.c.assign(m_size, 0);
  a.dx.assign(m_size, 0.0f);
}

// Row m as reference.quantize_activations(x, per_row=True): amax over the row (a max is exact in any order),
// d = amax / 127, q = x * (1 / d) rounded half to even, as the per-block quantize_rows does per block.
// `act` (or null): SmoothQuant's per-channel multipliers, x * act rounded once per element before anything
// else, as the reference's x.float() * act_scale.
inline __m512 scaled(const float* xr, const float* act, int64_t i) {
  const __m512 v = _mm512_loadu_ps(xr + i);
  return act == nullptr ? v : _mm512_mul_ps(v, _mm512_loadu_ps(act + i));
}

inline void quantize_row(const float* x, const float* act, int64_t m, RowActivations& a) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const int64_t k_size = a.k;
  const float* xr = x + m * k_size;
  __m512 mx = _mm512_setzero_ps();
  __mmask16 bad = 0;  // lanes that held a NaN or an infinity (fpclass: QNaN, +Inf, -Inf, SNaN)
  for (int64_t i = 0; i < k_size; i += 16) {
    const __m512 v = scaled(xr, act, i);
    bad |= _mm512_fpclass_ps_mask(v, 0x99);
    mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
  }
  if (bad) {  // the row's q stay zero and its scale NaN: every output NaN, as in the reference
    a.dx[m] = specdec_quant::kNaN;
    return;
  }
  const float d = _mm512_reduce_max_ps(mx) / 127.0f;
  const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  __m512i total = _mm512_setzero_si512();
  int8_t* qr = a.q.data() + m * k_size;
  for (int64_t i = 0; i < k_size; i += 16) {
    const __m512i qv = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(scaled(xr, act, i), inv), kNearest));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + i), _mm512_cvtepi32_epi8(qv));
    total = _mm512_add_epi32(total, qv);
  }
  a.c[m] = -128 * _mm512_reduce_add_epi32(total);
  a.dx[m] = d;
}

// 16 outputs of one row: float(isum) * (s * dx), the reference's two roundings
inline __m512 outputs(__m512i isum, __m512 sv, float dx) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(sv, _mm512_set1_ps(dx)));
}

// VNNI: rows [row0, row0 + rows) against one tile (16 columns), their int32 sums in `acc` [rows][16] across
// the blocks (each block's 8 weight vectors loaded once and fed to every row), then out [rows][16].
template <typename S>
void tile_rows_vnni(const int8_t* w, const S* s, const RowActivations& a, int64_t row0, int64_t rows, int32_t* acc,
                    float* out) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t blocks = a.k / kBlock;
  for (int64_t r = 0; r < rows; ++r) _mm512_store_si512(acc + 16 * r, _mm512_set1_epi32(a.c[row0 + r]));
  for (int64_t b = 0; b < blocks; ++b) {
    const int8_t* wb = w + b * kTile * kBlock;
    for (int l = 0; l < 8; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb) + 2048 + 64 * l, _MM_HINT_T0);
    __m512i wv[8];
    for (int g = 0; g < 8; ++g) wv[g] = _mm512_xor_si512(load(wb + g * 64), flip);  // q + 128, unsigned
    for (int64_t r = 0; r < rows; ++r) {
      const int8_t* xr = a.q.data() + (row0 + r) * a.k + b * kBlock;
      __m512i lo = _mm512_load_si512(acc + 16 * r), hi = _mm512_setzero_si512();
      for (int g = 0; g < 4; ++g) {
        int32_t v0, v1;
        std::memcpy(&v0, xr + 4 * g, 4);
        std::memcpy(&v1, xr + 16 + 4 * g, 4);
        lo = _mm512_dpbusd_epi32(lo, wv[g], _mm512_set1_epi32(v0));
        hi = _mm512_dpbusd_epi32(hi, wv[g + 4], _mm512_set1_epi32(v1));
      }
      _mm512_store_si512(acc + 16 * r, _mm512_add_epi32(lo, hi));
    }
  }
  const __m512 sv = load_scales(s);
  for (int64_t r = 0; r < rows; ++r)
    _mm512_store_ps(out + 16 * r, outputs(_mm512_load_si512(acc + 16 * r), sv, a.dx[row0 + r]));
}

#ifdef SPECDEC_AMX_INT8
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8")

// Whether the call runs on AMX: the tiles take k in steps of 64, so an odd number of blocks stays on VNNI
inline bool amx_rows(int64_t k_size) { return k_size % 64 == 0 && specdec_amx::amx_permitted(); }

// tiles 0-3: C (up to four 16-row tiles of x), 4: B (64 k x 16 columns), 5-6: A; all 16 rows x 64 bytes
inline specdec_amx::TileConfig rows_tile_config() { return specdec_amx::bf16_tile_config(); }

// One column tile against the row tiles [tile0, tile0 + n) (n <= 4): C tile j takes x rows 16 (tile0 + j)..
// against every 64 k of the weights, in k order (int32, exact), then each row's 16 outputs. The weights are
// read once per call for up to 64 rows, and prefetched 2 KB ahead (tile loads stall on misses).
template <typename S>
void tile_rows_amx(const int8_t* w, const S* s, const RowActivations& a, int64_t tile0, int64_t n,
                   const specdec_quant::OutputRows& y, int64_t col0) {
  const int64_t steps = a.k / 64, lda = a.k;
  const int8_t* x0 = a.q.data() + tile0 * 16 * lda;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kk = 0; kk < steps; ++kk) {
    const int8_t* wb = w + kk * 1024;
    for (int l = 0; l < 16; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb) + 2048 + 64 * l, _MM_HINT_T0);
    _tile_loadd(4, wb, 64);
    _tile_loadd(5, x0 + kk * 64, lda);
    _tile_dpbssd(0, 5, 4);
    if (n > 1) {
      _tile_loadd(6, x0 + 16 * lda + kk * 64, lda);
      _tile_dpbssd(1, 6, 4);
    }
    if (n > 2) {
      _tile_loadd(5, x0 + 32 * lda + kk * 64, lda);
      _tile_dpbssd(2, 5, 4);
    }
    if (n > 3) {
      _tile_loadd(6, x0 + 48 * lda + kk * 64, lda);
      _tile_dpbssd(3, 6, 4);
    }
  }
  alignas(64) int32_t c[4][256];
  alignas(64) float out[16];
  _tile_stored(0, c[0], 64);
  if (n > 1) _tile_stored(1, c[1], 64);
  if (n > 2) _tile_stored(2, c[2], 64);
  if (n > 3) _tile_stored(3, c[3], 64);
  const __m512 sv = load_scales(s);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < 16; ++r) {
      const int64_t row = (tile0 + j) * 16 + r;
      if (row >= a.m) break;
      _mm512_store_ps(out, outputs(_mm512_load_si512(c[j] + 16 * r), sv, a.dx[row]));
      y.store(row, col0, out, kTile);
    }
}

#pragma GCC pop_options
#endif

// Every tile against every row of x into y; the threads split the column tiles. S: the scales' type.
template <typename S>
void run_rows(const float* x, const float* act, int64_t m_size, int64_t k_size, const S* sp, const at::Tensor& quants,
              const specdec_quant::OutputRows& y) {
  // buffers reused from call to call (a fresh one is an mmap and page faults); the OpenMP threads read the
  // calling thread's through this reference (naming the thread_local there would give each its own, empty)
  static thread_local RowActivations reused;
  RowActivations& a = reused;
  shape_rows(m_size, k_size, a);
  const int64_t tiles = quants.size(0), tile_bytes = k_size * kTile;
  const auto* qp = static_cast<const int8_t*>(quants.data_ptr());
#ifdef SPECDEC_AMX_INT8
  if (amx_rows(k_size)) {
    const int64_t row_tiles = a.rows_padded / 16;
#pragma omp parallel num_threads(at::get_num_threads())
    {
#pragma omp for schedule(static)
      for (int64_t m = 0; m < m_size; ++m) quantize_row(x, act, m, a);  // (the loop's end waits for every row)
      specdec_amx::ThreadTiles tile_state(rows_tile_config());
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tiles; ++t)
        for (int64_t g = 0; g < row_tiles; g += 4)
          tile_rows_amx(qp + t * tile_bytes, sp + t * kTile, a, g, std::min<int64_t>(4, row_tiles - g), y, t * kTile);
    }
    return;
  }
#endif
  constexpr int64_t kRows = 64;  // rows per pass over a tile (their sums and outputs stay in L1)
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t m = 0; m < m_size; ++m) quantize_row(x, act, m, a);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t t = 0; t < tiles; ++t) {
    alignas(64) int32_t acc[kRows * kTile];
    alignas(64) float out[kRows * kTile];
    for (int64_t row0 = 0; row0 < m_size; row0 += kRows) {
      const int64_t rows = std::min(kRows, m_size - row0);
      tile_rows_vnni(qp + t * tile_bytes, sp + t * kTile, a, row0, rows, acc, out);
      for (int64_t r = 0; r < rows; ++r) y.store(row0 + r, t * kTile, out + r * kTile, kTile);
    }
  }
}

}  // namespace specdec_w8a8

#pragma GCC pop_options
