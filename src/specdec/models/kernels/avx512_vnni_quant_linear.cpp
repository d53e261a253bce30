// y = x @ dequant(W).T for weight-only quantized W, on CPUs with AVX512-VNNI (+ F, BW, VL): the same bits as
// avx2_quant_linear.cpp and quantization/reference.py, with a cost that grows slowly with the rows.
//
// Why: verifying 8-16 draft rows must cost about what one row costs, or speculation eats the quantization's
// gain. The AVX2 kernel spends sign + maddubs + madd + add (and two broadcasts) on each (row, 4 k, 8 columns)
// product, so beyond 4 rows it is compute-bound. vpdpbusd does a (row, 4 k, 16 columns) int8 product with
// its int32 accumulation in one instruction, x's 4 bytes broadcast from memory; each block of weights is
// loaded into registers once and feeds every row. Built with SPECDEC_AMX_INT8 (quantization/kernel.py's
// amx_int8 build), a call of 16 rows or more (32 for u4) runs its whole 16-row tiles on AMX-INT8 instead
// (amx_int8_quant_tiles.h: the same integers and float chain, so the same bits) and the rest here.
//
// Arithmetic: that of avx2_quant_linear.cpp's header (the activations quantized per block of 32 to the same
// values, an exact int32 sum per (row, column, block), then the same float chain per element, block after
// block, with separate multiplies and adds: -ffp-contract=off and no FMA intrinsic). Only the integer part
// is computed differently, and integer sums are exact in any order:
//   - vpdpbusd multiplies unsigned bytes by signed ones. 4-bit quants (0..15) are unsigned already. An int8
//     quant q becomes q + 128 (xor 0x80, once per weight vector, shared by every row), and the row's sum
//     starts from -128 * sum(qx) over the same k, so it ends at sum(q * qx) exactly (q = -128 included).
//   - Each sum runs in two chains, the block's first and second 16 k: Q6_K's two sub-scales apply to them;
//     elsewhere they are added.
//   - s5 (GGUF's Q5_0, quants in -16..15) reads u = q + 16 (unsigned already) and starts from -16 * sum(qx).
// Layout: tiles of 16 columns (quantized_weight.pack_tiles; the AVX2 build reads tiles of 8), per tile and
// block groups of 4 k with the 16 columns side by side: s8 [N / 16][blocks][8 groups][16][4 bytes], u4
// [N / 16][blocks][4][16][4] (the low nibbles groups 0-3, the high ones 4-7), s5 [N / 16][blocks][5][16][4]
// (u4's four vectors and a plane of fifth bits); scales and mins [N / 16][blocks][16] float32 or float16
// (values that are float16: a GGUF's own, and our quantizers'), or s8 without sub-scales [N / 16][16] (one
// per column, see scale_step), sub-scales [N / 16][blocks][16][2] int16.
// One vector is one group of a block,
// column c's 4 bytes in lane c, so nothing is summed across lanes, and a tile is one contiguous stream (two
// 8-column tiles per vector, read as two streams, ran one row at 0.6x the memory's speed).
// Loop: per tile, per block, the weights in 8 registers, then every row (up to 64 per pass; their running
// sums in a 4 KB buffer, as the rows of y lie a whole row apart). The weights are read from memory once per
// call at a steady pace whatever the number of rows, which lets the prefetch overlap them with the products.
// Activations are block-major ([blocks][M][32]), so a block's rows are one run. Threads split tiles, so
// columns only, never k. Which pass, row group or thread a row falls in changes no operation on it: every
// row is bit-identical whatever the number of rows.
// Cost on a Zen 4 core: vpdpbusd and the float multiplies share two pipes, one 512-bit op per cycle: per
// (row, block, 16 columns) 8 vpdpbusd + 2 multiplies (3 for u4) = 10 (11) cycles, measured about 11. That
// floor, not memory, bounds many rows: on the LM head (262144 x 640) about 0.45 ms per row on two cores.
#include <torch/csrc/utils/pybind.h>  // not torch/extension.h: it takes minutes to compile
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")

#include "quant_linear_args.h"
#include "avx512_quant_blocks.h"
#ifdef SPECDEC_AMX_INT8
#include "amx_int8_quant_tiles.h"
#endif
#include "avx512_w8a8_rows.h"
#include "avx512_u4r_rows.h"

int64_t amx_tile_rows(int64_t m_size, int64_t kind);

namespace {

using specdec_quant512::Activations;
using specdec_quant512::kBlock;
using specdec_quant512::kTile;
using specdec_quant512::load;
using specdec_quant512::load_scales;
#ifndef PF_AHEAD
#define PF_AHEAD 2048  // bytes of weights prefetched ahead of the block being read
#endif
#ifndef ROW_GROUP
#define ROW_GROUP 64  // rows per pass over a tile's weights (their running sums, 4 KB, stay in L1)
#endif
constexpr int64_t kRowGroup = ROW_GROUP;

inline __m512i x4(const int8_t* p) {  // 4 activation bytes in every lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The stream runs ahead of the hardware prefetcher alone (one row is bound by reading the weights); past
// the tile's end it touches the next tile's, which the next call reads. Prefetches change no result.
template <int kLines>
inline void prefetch_ahead(const void* p) {
  for (int l = 0; l < kLines; ++l) _mm_prefetch(static_cast<const char*>(p) + PF_AHEAD + 64 * l, _MM_HINT_T0);
}

// Adds the block's products of the weights' groups 0-3 (x's first 16 bytes) to lo and of groups 4-7 to hi.
inline void block_dots(const __m512i* wv, const int8_t* x, __m512i& lo, __m512i& hi) {
  for (int g = 0; g < 4; ++g) {
    lo = _mm512_dpbusd_epi32(lo, wv[g], x4(x + 4 * g));
    hi = _mm512_dpbusd_epi32(hi, wv[g + 4], x4(x + 16 + 4 * g));
  }
}

// Rows row0 .. row0 + rows - 1 against one tile (16 columns) of s8 weights, block after block; acc [rows][16]
// holds the running sums. A tile's block is 8 vectors, one per group of 4 k: column c's 4 bytes in lane c,
// so a lane's int32 sum is column c's dot product and nothing is summed across lanes.
template <bool kSub, typename S>
void tile_s8(const int8_t* w, const S* s, int64_t s_step, const int16_t* sub, const Activations& a, int64_t row0,
             int64_t rows, float* acc) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int8_t* wb = w + b * kTile * kBlock;
    prefetch_ahead<8>(wb);
    __m512i wv[8];
    for (int g = 0; g < 8; ++g) wv[g] = _mm512_xor_si512(load(wb + g * 64), flip);  // q + 128, unsigned
    const __m512 sv = load_scales(s + b * s_step);
    __m512i sub_lo = _mm512_setzero_si512(), sub_hi = sub_lo;
    if (kSub) {  // column c's two int16 sub-scales -> int32 lane c
      const __m512i pairs = load(sub + b * kTile * 2);
      sub_lo = _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16);
      sub_hi = _mm512_srai_epi32(pairs, 16);
    }
    const int64_t first = b * a.m + row0;
    const int8_t* xq = a.q + first * kBlock;
    const int32_t* c = a.c + first * 2;
    const float* dx = a.dx + first;
    for (int64_t r = 0; r < rows; ++r) {
      __m512i lo = _mm512_set1_epi32(c[2 * r]), hi = _mm512_set1_epi32(c[2 * r + 1]);
      block_dots(wv, xq + r * kBlock, lo, hi);
      const __m512i isum = kSub ? _mm512_add_epi32(_mm512_mullo_epi32(lo, sub_lo), _mm512_mullo_epi32(hi, sub_hi))
                                : _mm512_add_epi32(lo, hi);
      const __m512 t = _mm512_mul_ps(sv, _mm512_set1_ps(dx[r]));
      float* y = acc + r * kTile;
      _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), _mm512_mul_ps(_mm512_cvtepi32_ps(isum), t)));
    }
  }
}

// The same for u4 weights: a block is 4 vectors, the low nibbles of vector h holding group h and the high
// ones group h + 4.
template <typename S>
void tile_u4(const uint8_t* w, const S* s, const S* mins, const Activations& a, int64_t row0, int64_t rows,
             float* acc) {
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* wb = w + b * kTile * (kBlock / 2);
    prefetch_ahead<4>(wb);
    __m512i wv[8];
    specdec_quant512::unpack_nibbles(wb, wv);
    const __m512 sv = load_scales(s + b * kTile);
    const __m512 mv = load_scales(mins + b * kTile);
    const int64_t first = b * a.m + row0;
    const int8_t* xq = a.q + first * kBlock;
    const float* dx = a.dx + first;
    const float* sx = a.sx + first;
    for (int64_t r = 0; r < rows; ++r) {
      __m512i lo = _mm512_setzero_si512(), hi = lo;
      block_dots(wv, xq + r * kBlock, lo, hi);
      const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
      const __m512 t = _mm512_mul_ps(sv, _mm512_set1_ps(dx[r]));
      const __m512 u = _mm512_mul_ps(mv, _mm512_set1_ps(sx[r]));
      float* y = acc + r * kTile;
      _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), _mm512_sub_ps(_mm512_mul_ps(f, t), u)));
    }
  }
}

// The same for s5 weights (s8 quants in -16..15, GGUF's Q5_0): u4's four vectors of nibbles holding u = q + 16
// and a fifth vector whose byte (column, j) holds in bit g the fifth bit of group g's byte j. The unsigned
// u times x's signed bytes go straight into vpdpbusd; each half's sum starts from -16 * sum(qx) over its 16 k
// (the VNNI start -128 * sum / 8, exact), so it ends at sum(q * qx): the s8 integer, from 20 bytes a block
// of 32 per column instead of 32.
template <typename S>
void tile_s5(const uint8_t* w, const S* s, const Activations& a, int64_t row0, int64_t rows, float* acc) {
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* wb = w + b * kTile * 20;
    prefetch_ahead<5>(wb);
    __m512i wv[8];
    specdec_quant512::unpack_s5(wb, wv);
    const __m512 sv = load_scales(s + b * kTile);
    const int64_t first = b * a.m + row0;
    const int8_t* xq = a.q + first * kBlock;
    const int32_t* c = a.c + first * 2;
    const float* dx = a.dx + first;
    for (int64_t r = 0; r < rows; ++r) {
      __m512i lo = _mm512_set1_epi32(c[2 * r] / 8), hi = _mm512_set1_epi32(c[2 * r + 1] / 8);
      block_dots(wv, xq + r * kBlock, lo, hi);
      const __m512 t = _mm512_mul_ps(sv, _mm512_set1_ps(dx[r]));
      float* y = acc + r * kTile;
      const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
      _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), _mm512_mul_ps(f, t)));
    }
  }
}

// Quantizes rows of x (float32 [M, K], K a multiple of 32) per block of 32, to the AVX2 kernel's values (see
// its header): max and integer sums are exact in any order, x * inv is one rounding per element, and
// roundscale to nearest rounds half to even as its nearbyint does. Block-major, plus the -128 * sum(q) that
// start the s8 sums.
void quantize_rows(const float* x, int64_t m_size, int64_t k_size, int8_t* q, int32_t* c, float* dx, float* sx) {
  const int64_t blocks = k_size / kBlock;
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  // a prefill's rows on the threads (each row's values are its own): on one thread, quantizing 500 rows
  // took about 6% of a GGUF prefill while the other thread waited
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads()) if (m_size >= 32)
  for (int64_t m = 0; m < m_size; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + m * k_size + b * kBlock;
      const int64_t at = b * m_size + m;
      if (!specdec_quant::block_finite(xb, kBlock)) {
        std::memset(q + at * kBlock, 0, kBlock);
        c[at * 2] = c[at * 2 + 1] = 0;
        dx[at] = sx[at] = specdec_quant::kNaN;
        continue;
      }
      const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      const float d = amax / 127.0f;
      const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(x0, inv), kNearest));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(x1, inv), kNearest));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + at * kBlock), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + at * kBlock + 16), _mm512_cvtepi32_epi8(q1));
      const int32_t half0 = _mm512_reduce_add_epi32(q0), half1 = _mm512_reduce_add_epi32(q1);
      c[at * 2] = -128 * half0;
      c[at * 2 + 1] = -128 * half1;
      dx[at] = d;
      sx[at] = d * static_cast<float>(half0 + half1);
    }
}

// Every tile against rows [row_begin, a.m), the threads splitting tiles (columns) only; scales float32 or
// float16 (S).
template <typename S>
void run_tiles(const S* sp, const at::Tensor& scales_of_tiles, const Activations& a, int64_t row_begin,
               const at::Tensor& quants,
               const at::Tensor& mins, const at::Tensor& sub_scales, int64_t kind, bool sub,
               const specdec_quant::OutputRows& y) {
  const int64_t m_size = a.m, tiles = quants.size(0);
  const int64_t tile_bytes = a.blocks * specdec_quant512::block_bytes(kind);
  const int64_t tile_scales = a.blocks * kTile;  // scales (and int16 pairs) per tile
  const int64_t s_step = specdec_quant::scale_step(scales_of_tiles, quants, kTile);  // s8: per block or column
  const int64_t s8_scales = s_step == 0 ? kTile : tile_scales;
  const auto* qp = static_cast<const uint8_t*>(quants.data_ptr());
  const int16_t* subp = sub ? sub_scales.data_ptr<int16_t>() : nullptr;
  const S* minp = kind == 1 ? static_cast<const S*>(mins.data_ptr()) : nullptr;  // the scales' type
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t t = 0; t < tiles; ++t) {
    const uint8_t* w = qp + t * tile_bytes;
    const S* s = sp + t * tile_scales;
    alignas(64) float acc[kRowGroup * kTile];
    for (int64_t row0 = row_begin; row0 < m_size; row0 += kRowGroup) {
      const int64_t rows = std::min(kRowGroup, m_size - row0);
      std::fill(acc, acc + rows * kTile, 0.0f);
      if (kind == 2)
        tile_s5(w, s, a, row0, rows, acc);
      else if (kind == 1)
        tile_u4(w, s, minp + t * tile_scales, a, row0, rows, acc);
      else if (sub)
        tile_s8<true>(reinterpret_cast<const int8_t*>(w), s, kTile, subp + t * tile_scales * 2, a, row0, rows, acc);
      else
        tile_s8<false>(reinterpret_cast<const int8_t*>(w), sp + t * s8_scales, s_step, nullptr, a, row0, rows, acc);
      for (int64_t r = 0; r < rows; ++r) y.store(row0 + r, t * kTile, acc + r * kTile, kTile);
    }
  }
}

// Quantizes x's rows and runs every tile against them into y (specdec_quant::RunTiles).
void run(at::Tensor x, const at::Tensor& quants, const at::Tensor& scales, const at::Tensor& mins,
         const at::Tensor& sub_scales, int64_t kind, bool sub, const specdec_quant::OutputRows& y) {
  const int64_t m_size = x.size(0), k_size = x.size(1), blocks = k_size / kBlock;
  if (m_size == 0 || quants.size(0) == 0) return;
  // x as float32, reused from call to call (a fresh 128 KB buffer is an mmap and page faults) by every kind
  static thread_local std::vector<float> xf;
  if (kind == 4) {  // u4r (int4): x per row, one int32 sum per output (avx512_u4r_rows.h)
    const float* xp = specdec_quant::float_rows(x, xf);
    const float* act = mins.numel() > 0 ? mins.data_ptr<float>() : nullptr;  // SmoothQuant's multipliers
    const int16_t* ints = sub_scales.data_ptr<int16_t>();
    if (scales.scalar_type() == at::kHalf)
      specdec_u4r::run_rows(xp, act, m_size, k_size, static_cast<const uint16_t*>(scales.data_ptr()), quants, ints, y);
    else
      specdec_u4r::run_rows(xp, act, m_size, k_size, scales.data_ptr<float>(), quants, ints, y);
    return;
  }
  if (kind == 3) {  // s8r (w8a8_int8): x per row, one int32 sum per output (avx512_w8a8_rows.h)
    const float* xp = specdec_quant::float_rows(x, xf);
    const float* act = mins.numel() > 0 ? mins.data_ptr<float>() : nullptr;  // SmoothQuant's multipliers
    if (scales.scalar_type() == at::kHalf)
      specdec_w8a8::run_rows(xp, act, m_size, k_size, static_cast<const uint16_t*>(scales.data_ptr()), quants, y);
    else
      specdec_w8a8::run_rows(xp, act, m_size, k_size, scales.data_ptr<float>(), quants, y);
    return;
  }
  // plain buffers rather than tensors (a decode step makes ~70 calls, and each at::empty costs a dispatch),
  // reused from call to call: a prefill's fresh megabytes were page faults and zero fills on every call
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<int32_t> c;
  static thread_local std::vector<float> dx, sx;
  constexpr int64_t kPad = 16;  // rows of padding after the last block, which AMX's last row tile may read
  q.resize((blocks * m_size + kPad) * kBlock);
  c.resize((blocks * m_size + kPad) * 2);
  dx.resize(blocks * m_size + kPad);
  sx.resize(blocks * m_size + kPad);
  // the padding zeroed: an earlier call's leftovers there could be denormals, which slow the float chains
  std::fill(q.end() - kPad * kBlock, q.end(), 0);
  std::fill(c.end() - kPad * 2, c.end(), 0);
  std::fill(dx.end() - kPad, dx.end(), 0.0f);
  std::fill(sx.end() - kPad, sx.end(), 0.0f);
  quantize_rows(specdec_quant::float_rows(x, xf), m_size, k_size, q.data(), c.data(), dx.data(), sx.data());
  const Activations a{q.data(), c.data(), dx.data(), sx.data(), m_size, blocks};
  const bool half = scales.scalar_type() == at::kHalf;
  int64_t vnni_from = 0;  // rows before it ran on AMX; the same bits either way
#ifdef SPECDEC_AMX_INT8
  vnni_from = amx_tile_rows(m_size, kind);
  if (vnni_from > 0) {
    if (half)
      specdec_quant512::amx_run_tiles(static_cast<const uint16_t*>(scales.data_ptr()), scales, a, vnni_from, quants,
                                      mins, sub_scales, kind, sub, y);
    else
      specdec_quant512::amx_run_tiles(scales.data_ptr<float>(), scales, a, vnni_from, quants, mins, sub_scales, kind,
                                      sub, y);
  }
#endif
  if (vnni_from == m_size) return;
  if (half)
    run_tiles(static_cast<const uint16_t*>(scales.data_ptr()), scales, a, vnni_from, quants, mins, sub_scales, kind,
              sub, y);
  else
    run_tiles(scales.data_ptr<float>(), scales, a, vnni_from, quants, mins, sub_scales, kind, sub, y);
}

}  // namespace

// x: [M, K] float32 or bfloat16 (K a multiple of 32); returns [M, N] (N = 16 * tiles), float32 or with
// out_bf16 bfloat16.
// kind 0 (s8): quants int8 [tiles, blocks, 8, 16, 4], sub_scales int16 [tiles, blocks, 16, 2] or empty;
// kind 1 (u4): quants uint8 [tiles, blocks, 4, 16, 4], mins float [tiles, blocks, 16];
// kind 2 (s5): quants uint8 [tiles, blocks, 5, 16, 4] (see tile_s5); kind 3 (s8r): kind 0's quants with one
// scale per column, x quantized per row (avx512_w8a8_rows.h), mins empty or x's per-channel multipliers
// [K] float32; kind 4 (u4r): kind 1's quants, one scale per column, x per row, mins as kind 3, sub_scales
// int16 [tiles, pairs of blocks, 64] (avx512_u4r_rows.h). Scales float32, or float16 values.
at::Tensor quant_linear(at::Tensor x, at::Tensor quants, at::Tensor scales, at::Tensor mins, at::Tensor sub_scales,
                        int64_t kind, bool out_bf16) {
  return specdec_quant::linear_values(run, kTile, kBlock, x, quants, scales, mins, sub_scales, kind, out_bf16);
}

// [M] int64: rows_argmax(quant_linear(x, ...)[:, :n_valid]) without the logits (see RowMaxima).
at::Tensor quant_linear_argmax(at::Tensor x, at::Tensor quants, at::Tensor scales, at::Tensor mins,
                               at::Tensor sub_scales, int64_t kind, int64_t n_valid) {
  return specdec_quant::linear_argmax(run, kTile, kBlock, x, quants, scales, mins, sub_scales, kind, n_valid);
}

// (indices, values): quant_linear_argmax's picks with their values (see specdec_quant::linear_max).
std::tuple<at::Tensor, at::Tensor> quant_linear_max(at::Tensor x, at::Tensor quants, at::Tensor scales,
                                                    at::Tensor mins, at::Tensor sub_scales, int64_t kind,
                                                    int64_t n_valid) {
  return specdec_quant::linear_max(run, kTile, kBlock, x, quants, scales, mins, sub_scales, kind, n_valid);
}

#pragma GCC pop_options

// quant_linear's address, for the CPU module's decoder_layer_call (kernels/avx2_decoder_layer.cpp), which calls
// it without going back through Python
int64_t quant_linear_address() { return reinterpret_cast<int64_t>(&quant_linear); }

// Rows of an m_size-row call on weights of `kind` that run on AMX (0 in the VNNI-only build, or where the OS
// withholds the tile state): the tests check that the AMX build's split does reach AMX.
int64_t amx_tile_rows(int64_t m_size, int64_t kind) {
#ifdef SPECDEC_AMX_INT8
  if (kind == 3) return specdec_amx::amx_permitted() ? m_size : 0;  // every row, where K is a multiple of 64
  if (kind == 4) return specdec_u4r::amx_rows(m_size, 64) ? m_size : 0;  // every row from kAmxFrom rows on
  return specdec_quant512::amx_rows(m_size, kind) ? m_size : 0;  // the last row tile padded
#else
  return 0;
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("amx_tile_rows", &amx_tile_rows, "rows of a call that run on AMX-INT8", py::arg("m_size"),
        py::arg("kind"));
  m.def("quant_linear_address", &quant_linear_address, "quant_linear as a function address");
  // kinds 3 (s8r, w8a8_int8) and 4 (u4r, int4), x quantized per row, run in this build (not the AVX2 one)
  m.attr("quant_linear_row_kinds") = py::make_tuple(3, 4);
  m.def("quant_linear", &quant_linear, "x @ dequant(W).T for s8 / u4 tiled weights, row-invariant (AVX512-VNNI)",
        py::arg("x"), py::arg("quants"), py::arg("scales"), py::arg("mins"), py::arg("sub_scales"), py::arg("kind"),
        py::arg("out_bf16") = false);
  m.def("quant_linear_argmax", &quant_linear_argmax, "each row's argmax of quant_linear over n_valid columns",
        py::arg("x"), py::arg("quants"), py::arg("scales"), py::arg("mins"), py::arg("sub_scales"), py::arg("kind"),
        py::arg("n_valid"));
  m.def("quant_linear_max", &quant_linear_max, "each row's argmax of quant_linear over n_valid columns, and its value",
        py::arg("x"), py::arg("quants"), py::arg("scales"), py::arg("mins"), py::arg("sub_scales"), py::arg("kind"),
        py::arg("n_valid"));
}
