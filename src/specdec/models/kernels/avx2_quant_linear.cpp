// y = x @ dequant(W).T for weight-only quantized W, on CPUs with AVX2 (llama.cpp's integer dot products,
// arranged so that every output row is bit-identical whatever the number of rows).
//
// Why our own: torch's weight-only int8/int4 CPU kernels are fast for one row but dequantize per call (or
// take a slow path) for several, so verifying 8-16 draft rows loses the gain; and nothing promises that a
// row's bits do not depend on how many rows share the call, which lossless speculation needs.
//
// Arithmetic (reproduced op for op in torch by quantization/reference.py, which is the portable fallback):
//   - Each row of x is quantized per block of 32 to int8: amax = max|x|, dx = amax / 127, inv = 1 / dx
//     (0 when amax is 0), qx = round-half-even(x * inv); bsum = sum(qx) (int).
//   - Weights are int8 ("s8": w = s * q, optionally q times an int16 sub-scale per 16, for Q6_K) or 4-bit
//     ("u4": w = s * q - m, q in 0..15), with one float s (and m) per column and block of 32.
//   - Per (row, column, block) an exact int32 dot product isum; then, block after block in k order,
//       s8: y = y + float(isum) * (s * dx)
//       u4: y = y + (float(isum) * (s * dx) - m * (dx * float(bsum)))
//     with no fused multiply-add (built with -ffp-contract=off). The integer part is exact in any order, and
//     the float part is one fixed chain per element, so neither the rows sharing the call, nor the blocking,
//     nor the threads (which split columns, never k) change a bit.
// s5 is s8 with quants in -16..15 (GGUF's Q5_0) stored in 5 bits: u = q + 16 as u4's nibbles plus a bit plane
// of u's fifth bits, 22 bytes a block instead of 34; isum = (the unsigned products' sum) - 16 * bsum, the same
// integer, so the same bits as s8 with 35% fewer bytes to read.
// Layout: weights in tiles of 8 columns; per tile and block, groups of 4 k with the 8 columns side by side:
// s8 [N / 8][blocks][8 groups][8 columns][4 bytes]; u4 [N / 8][blocks][4][8 columns][4 bytes], the low nibbles
// holding groups 0-3 and the high ones groups 4-7; s5 [N / 8][blocks][5][8 columns][4 bytes], u4's four vectors
// and a fifth whose byte (column, j) holds in bit g the fifth bit of group g's byte. Scales and mins
// [N / 8][blocks][8] float32 or float16 (values that are float16, a GGUF's own and our quantizers', read
// exactly: fewer bytes for the memory-bound LM head), sub-scales [N / 8][blocks][8][2] int16: a tile streams
// from one contiguous range, and no sum crosses lanes.
#include <torch/csrc/utils/pybind.h>  // not torch/extension.h: it takes minutes to compile
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "quant_linear_args.h"
#include "avx2_quant_rows.h"

namespace {

using specdec_quant::for_row_blocks;
constexpr int64_t kBlock = 32;
constexpr int64_t kTile = 8;
#ifndef PF_AHEAD
// bytes of weights prefetched ahead of the block being read: on the 2-core AVX2 EPYC, 1024 read the Q8_0 LM
// head 15% faster than 2048 at one row (7.1 vs 8.3 ms) and the same at 4-8 rows
#define PF_AHEAD 1024
#endif

struct Activations {
  const int8_t* q;     // [M][kp] int8
  const int8_t* absq;  // |q|, the unsigned operand of the s8 products
  const float* dx;     // [M][blocks]
  const float* sx;     // [M][blocks] dx * float(bsum)
  const int32_t* bsum;  // [M][blocks] sum of the block's quants (0 where x is not finite)
  int64_t kp, blocks;
};

// 8 scales as float32: float16 ones widen exactly (F16C)
inline __m256 load_scales(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_scales(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The R rows' 8 finished columns from `col` into y.
template <int R>
void store_rows(const __m256* acc, int64_t row0, const specdec_quant::OutputRows& y, int64_t col) {
  alignas(32) float v[kTile];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(v, acc[r]);
    y.store(row0 + r, col, v, kTile);
  }
}

// R rows against one tile (8 columns) of s8 weights, every block; y rows at stride ldy. A tile's block is 8
// vectors, one per group of 4 k: column c's 4 bytes in lane c, so a lane's int32 sum is column c's dot
// product and nothing is summed across lanes.
template <int R, bool kSub, typename S>
void tile_s8(const int8_t* w, const S* s, int64_t s_step, const int16_t* sub, const Activations& a, int64_t row0,
             const specdec_quant::OutputRows& y, int64_t col) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int8_t* wb = w + b * kTile * kBlock;
    // the stream runs ahead of the hardware prefetcher alone (one row is bound by reading weights); beyond
    // the tile's end it touches the next tile's, which the next call reads. Prefetches change no result.
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb + PF_AHEAD + 64 * l), _MM_HINT_T0);
    __m256i sub_lo = ones, sub_hi = ones;
    if (kSub) {  // column c's two int16 sub-scales -> int32 lane c
      const __m256i pair = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + b * kTile * 2));
      sub_lo = _mm256_srai_epi32(_mm256_slli_epi32(pair, 16), 16);
      sub_hi = _mm256_srai_epi32(pair, 16);
    }
    const __m256 sv = load_scales(s + b * s_step);
    for (int r = 0; r < R; ++r) {
      const int64_t m = row0 + r;
      const int8_t* xq = a.q + m * a.kp + b * kBlock;
      const int8_t* xa = a.absq + m * a.kp + b * kBlock;
      __m256i half[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int g = 0; g < 8; ++g) {
        int32_t xg, ag;
        std::memcpy(&xg, xq + 4 * g, 4);
        std::memcpy(&ag, xa + 4 * g, 4);
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * kBlock));
        const __m256i p = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi32(ag), _mm256_sign_epi8(wv, _mm256_set1_epi32(xg))), ones);
        half[g >> 2] = _mm256_add_epi32(half[g >> 2], p);
      }
      const __m256i isum = kSub ? _mm256_add_epi32(_mm256_mullo_epi32(half[0], sub_lo), _mm256_mullo_epi32(half[1], sub_hi))
                                : _mm256_add_epi32(half[0], half[1]);
      const __m256 t = _mm256_mul_ps(sv, _mm256_set1_ps(a.dx[m * a.blocks + b]));
      acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_cvtepi32_ps(isum), t));
    }
  }
  store_rows<R>(acc, row0, y, col);
}

// A u4 block's 8 group vectors from its 4 vectors of nibbles (the low ones group h, the high ones group h + 4)
inline void unpack_nibbles(const uint8_t* wb, __m256i* wv) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < 4; ++h) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + h * kBlock));
    wv[h] = _mm256_and_si256(raw, low4);
    wv[h + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
  }
}

// R rows against one tile of u4 weights: a block is 4 vectors, the low nibbles of vector h holding group h
// and the high ones group h + 4. Products are at most 2 * 15 * 127 per int16 pair, so the 8 groups add up in
// int16 without overflow (30480), and one madd per block widens them.
template <int R, typename S>
void tile_u4(const uint8_t* w, const S* s, const S* mins, const Activations& a, int64_t row0,
             const specdec_quant::OutputRows& y, int64_t col) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* wb = w + b * kTile * (kBlock / 2);
    for (int l = 0; l < 2; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb + PF_AHEAD + 64 * l), _MM_HINT_T0);
    __m256i wv[8];
    unpack_nibbles(wb, wv);
    const __m256 sv = load_scales(s + b * kTile);
    const __m256 mv = load_scales(mins + b * kTile);
    for (int r = 0; r < R; ++r) {
      const int64_t m = row0 + r;
      const int8_t* xq = a.q + m * a.kp + b * kBlock;
      __m256i sum16 = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        int32_t xg;
        std::memcpy(&xg, xq + 4 * g, 4);
        sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(wv[g], _mm256_set1_epi32(xg)));
      }
      const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16, ones));
      const __m256 t = _mm256_mul_ps(sv, _mm256_set1_ps(a.dx[m * a.blocks + b]));
      const __m256 u = _mm256_mul_ps(mv, _mm256_set1_ps(a.sx[m * a.blocks + b]));
      acc[r] = _mm256_add_ps(acc[r], _mm256_sub_ps(_mm256_mul_ps(f, t), u));
    }
  }
  store_rows<R>(acc, row0, y, col);
}

// R rows against one tile of s5 weights: u4's nibbles with the fifth bits OR-ed in from the bit plane. The
// unsigned products reach 2 * 31 * 127 per int16 pair, so each half of the block is widened on its own.
template <int R, typename S>
void tile_s5(const uint8_t* w, const S* s, const Activations& a, int64_t row0, const specdec_quant::OutputRows& y,
             int64_t col) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* wb = w + b * kTile * 20;
    for (int l = 0; l < 3; ++l) _mm_prefetch(reinterpret_cast<const char*>(wb + PF_AHEAD + 64 * l), _MM_HINT_T0);
    __m256i wv[8];
    unpack_nibbles(wb, wv);
    // bit g of each plane byte to bit 4 (shifts within 16-bit lanes: the mask keeps each byte's own bit)
    const __m256i plane = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 4 * kBlock));
    wv[0] = _mm256_or_si256(wv[0], _mm256_and_si256(_mm256_slli_epi16(plane, 4), bit4));
    wv[1] = _mm256_or_si256(wv[1], _mm256_and_si256(_mm256_slli_epi16(plane, 3), bit4));
    wv[2] = _mm256_or_si256(wv[2], _mm256_and_si256(_mm256_slli_epi16(plane, 2), bit4));
    wv[3] = _mm256_or_si256(wv[3], _mm256_and_si256(_mm256_slli_epi16(plane, 1), bit4));
    wv[4] = _mm256_or_si256(wv[4], _mm256_and_si256(plane, bit4));
    wv[5] = _mm256_or_si256(wv[5], _mm256_and_si256(_mm256_srli_epi16(plane, 1), bit4));
    wv[6] = _mm256_or_si256(wv[6], _mm256_and_si256(_mm256_srli_epi16(plane, 2), bit4));
    wv[7] = _mm256_or_si256(wv[7], _mm256_and_si256(_mm256_srli_epi16(plane, 3), bit4));
    const __m256 sv = load_scales(s + b * kTile);
    for (int r = 0; r < R; ++r) {
      const int64_t m = row0 + r;
      const int8_t* xq = a.q + m * a.kp + b * kBlock;
      __m256i half16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int g = 0; g < 8; ++g) {
        int32_t xg;
        std::memcpy(&xg, xq + 4 * g, 4);
        half16[g >> 2] = _mm256_add_epi16(half16[g >> 2], _mm256_maddubs_epi16(wv[g], _mm256_set1_epi32(xg)));
      }
      const __m256i usum = _mm256_add_epi32(_mm256_madd_epi16(half16[0], ones), _mm256_madd_epi16(half16[1], ones));
      const __m256i isum = _mm256_sub_epi32(usum, _mm256_set1_epi32(16 * a.bsum[m * a.blocks + b]));
      const __m256 t = _mm256_mul_ps(sv, _mm256_set1_ps(a.dx[m * a.blocks + b]));
      acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_cvtepi32_ps(isum), t));
    }
  }
  store_rows<R>(acc, row0, y, col);
}

// Quantizes rows of x (float32 [M, K], K a multiple of 32) per block of 32, see the header.
void quantize_rows(const float* x, int64_t m_size, int64_t k_size, int8_t* q, int8_t* absq, float* dx, float* sx,
                   int32_t* bsum) {
  const int64_t blocks = k_size / kBlock;
  // a prefill's rows on the threads (each row's values are its own)
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads()) if (m_size >= 32)
  for (int64_t m = 0; m < m_size; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + m * k_size + b * kBlock;
      if (!specdec_quant::block_finite(xb, kBlock)) {
        std::memset(q + m * k_size + b * kBlock, 0, kBlock);
        std::memset(absq + m * k_size + b * kBlock, 0, kBlock);
        dx[m * blocks + b] = sx[m * blocks + b] = specdec_quant::kNaN;
        bsum[m * blocks + b] = 0;
        continue;
      }
      float amax = 0.0f;
      for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float d = amax / 127.0f;
      const float inv = d > 0.0f ? 1.0f / d : 0.0f;
      int32_t sum = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        const int32_t v = static_cast<int32_t>(std::nearbyint(xb[i] * inv));  // round half to even
        q[m * k_size + b * kBlock + i] = static_cast<int8_t>(v);
        absq[m * k_size + b * kBlock + i] = static_cast<int8_t>(v < 0 ? -v : v);
        sum += v;
      }
      dx[m * blocks + b] = d;
      sx[m * blocks + b] = d * static_cast<float>(sum);
      bsum[m * blocks + b] = sum;
    }
}

// Every tile against every row, the threads splitting tiles (columns) only.
template <typename S>
void run_tiles(const S* sp, const at::Tensor& scales_of_tiles, const Activations& a, const at::Tensor& quants,
               const at::Tensor& mins, const at::Tensor& sub_scales, int64_t kind, bool sub, int64_t tiles,
               const specdec_quant::OutputRows& y) {
  const int64_t s_step = specdec_quant::scale_step(scales_of_tiles, quants, kTile);  // s8: per block or column
  const int64_t m_size = y.y.size(0), blocks = a.blocks;
  const int64_t tile_bytes = blocks * kTile * (kind == 0 ? kBlock : kind == 1 ? kBlock / 2 : 20);
  const auto* qp = static_cast<const uint8_t*>(quants.data_ptr());
  const int16_t* subp = sub ? sub_scales.data_ptr<int16_t>() : nullptr;
  const S* minp = kind == 1 ? static_cast<const S*>(mins.data_ptr()) : nullptr;  // the scales' type
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t t = 0; t < tiles; ++t) {
    const uint8_t* w = qp + t * tile_bytes;
    const S* s = sp + t * blocks * kTile;
    const int64_t col = t * kTile;
    if (kind == 2) {
      for_row_blocks(m_size, [&](auto r, int64_t m) { tile_s5<decltype(r)::value>(w, s, a, m, y, col); });
    } else if (kind == 1) {
      const S* mn = minp + t * blocks * kTile;
      for_row_blocks(m_size, [&](auto r, int64_t m) { tile_u4<decltype(r)::value>(w, s, mn, a, m, y, col); });
    } else if (sub) {
      const int16_t* sb = subp + t * blocks * kTile * 2;
      for_row_blocks(m_size, [&](auto r, int64_t m) {
        tile_s8<decltype(r)::value, true>(reinterpret_cast<const int8_t*>(w), s, kTile, sb, a, m, y, col);
      });
    } else {
      for_row_blocks(m_size, [&](auto r, int64_t m) {
        tile_s8<decltype(r)::value, false>(reinterpret_cast<const int8_t*>(w), sp + t * (s_step ? blocks : 1) * kTile,
                                           s_step, nullptr, a, m, y, col);
      });
    }
  }
}

// Quantizes x's rows and runs every tile against them into y (specdec_quant::RunTiles).
void run(at::Tensor x, const at::Tensor& quants, const at::Tensor& scales, const at::Tensor& mins,
         const at::Tensor& sub_scales, int64_t kind, bool sub, const specdec_quant::OutputRows& y) {
  const int64_t m_size = x.size(0), k_size = x.size(1), blocks = k_size / kBlock, tiles = quants.size(0);
  if (m_size == 0 || tiles == 0) return;
  // x as float32, reused from call to call (a prefill's fresh megabytes were page faults) by every kind
  static thread_local std::vector<float> xf;
  if (kind >= 3) {  // s8r, u4r: x per row, one int32 sum per output (avx2_quant_rows.h)
    const float* xp = specdec_quant::float_rows(x, xf);
    const float* act = mins.numel() > 0 ? mins.data_ptr<float>() : nullptr;  // SmoothQuant's multipliers
    const int16_t* ints = kind == 4 ? sub_scales.data_ptr<int16_t>() : nullptr;
    if (scales.scalar_type() == at::kHalf)
      specdec_rows2::run_rows(xp, act, m_size, k_size, static_cast<const uint16_t*>(scales.data_ptr()), quants, ints,
                              kind, y);
    else
      specdec_rows2::run_rows(xp, act, m_size, k_size, scales.data_ptr<float>(), quants, ints, kind, y);
    return;
  }
  // plain buffers rather than tensors (a decode step makes ~70 calls, and each at::empty costs a dispatch),
  // reused from call to call: a prefill's fresh megabytes were page faults and zero fills on every call
  static thread_local std::vector<float> dx, sx;
  static thread_local std::vector<int8_t> q, absq;
  static thread_local std::vector<int32_t> bsum;
  q.resize(m_size * k_size);
  absq.resize(m_size * k_size);
  dx.resize(m_size * blocks);
  sx.resize(m_size * blocks);
  bsum.resize(m_size * blocks);
  quantize_rows(specdec_quant::float_rows(x, xf), m_size, k_size, q.data(), absq.data(), dx.data(), sx.data(),
                bsum.data());
  const Activations a{q.data(), absq.data(), dx.data(), sx.data(), bsum.data(), k_size, blocks};
  if (scales.scalar_type() == at::kHalf)
    run_tiles(static_cast<const uint16_t*>(scales.data_ptr()), scales, a, quants, mins, sub_scales, kind, sub, tiles, y);
  else
    run_tiles(scales.data_ptr<float>(), scales, a, quants, mins, sub_scales, kind, sub, tiles, y);
}

}  // namespace

// x: [M, K] float32 or bfloat16 (K a multiple of 32); returns [M, N] (N = 8 * tiles), float32 or with
// out_bf16 bfloat16.
// kind 0 (s8): quants int8 [tiles, blocks, 8, 8, 4], sub_scales int16 [tiles, blocks, 8, 2] or empty;
// kind 1 (u4): quants uint8 [tiles, blocks, 4, 8, 4], mins float [tiles, blocks, 8];
// kind 2 (s5): quants uint8 [tiles, blocks, 5, 8, 4] (see the header); kinds 3 (s8r) and 4 (u4r), x per row:
// avx2_quant_rows.h.
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

// quant_linear's address, for the CPU module's decoder_layer_call (kernels/avx2_decoder_layer.cpp), which calls
// it without going back through Python
int64_t quant_linear_address() { return reinterpret_cast<int64_t>(&quant_linear); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quant_linear_address", &quant_linear_address, "quant_linear as a function address");
  m.attr("quant_linear_row_kinds") = py::make_tuple(3, 4);  // kinds 3 and 4 (x quantized per row) run here too
  m.def("quant_linear", &quant_linear, "x @ dequant(W).T for s8 / u4 tiled weights, row-invariant",
        py::arg("x"), py::arg("quants"), py::arg("scales"), py::arg("mins"), py::arg("sub_scales"), py::arg("kind"),
        py::arg("out_bf16") = false);
  m.def("quant_linear_argmax", &quant_linear_argmax, "each row's argmax of quant_linear over n_valid columns",
        py::arg("x"), py::arg("quants"), py::arg("scales"), py::arg("mins"), py::arg("sub_scales"), py::arg("kind"),
        py::arg("n_valid"));
  m.def("quant_linear_max", &quant_linear_max, "each row's argmax of quant_linear over n_valid columns, and its value",
        py::arg("x"), py::arg("quants"), py::arg("scales"), py::arg("mins"), py::arg("sub_scales"), py::arg("kind"),
        py::arg("n_valid"));
}
