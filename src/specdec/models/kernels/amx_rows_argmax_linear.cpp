// argmax(x @ w.T) per row for bfloat16 x [M, K] and w [N, K], with Intel AMX: greedy decoding's LM head
// without its logits.
//
// Why: at a batch's verification step the head's float32 logits are the largest thing the forward writes
// (a 262,144-token vocabulary is 1 MiB a row: 192 rows, 192 MiB), and reading them back for the argmax
// costs as much again. Here each C tile is compared while it is still in L1, so nothing of that size is
// written or read: the weights' stream and the tile multiplies are the whole cost.
//
// Same answer as rows_argmax(rows_linear(x, w)): every logit is computed by the same tile multiplies
// (amx_tiles.h's block_tiles), and the comparison keeps torch.argmax's rule: the first maximum, or the first
// NaN where a row has one. Each thread scans its contiguous range of columns in increasing order; the
// threads' candidates are then merged in column order with the same rule.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "amx_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

namespace {

using namespace specdec_amx;

// Each x row's best logit so far (value and column), 16 rows to a vector, one entry per m tile.
struct Best {
  std::vector<float> value;
  std::vector<int32_t> index;
  explicit Best(int64_t m_tiles)
      : value(static_cast<size_t>(m_tiles * kTileM), -std::numeric_limits<float>::infinity()),
        index(static_cast<size_t>(m_tiles * kTileM), 0) {}
};

// Folds a C^T tile (rows: columns n0.. of the logits, in order; lanes: the 16 x rows of m tile `tile`) into
// `best`: a lane takes a logit strictly greater than its best, or a NaN when its best is not one.
inline void fold(const float* out, int64_t rows, int64_t n0, int64_t tile, Best& best) {
  float* value = best.value.data() + tile * kTileM;
  int32_t* index = best.index.data() + tile * kTileM;
  __m512 bv = _mm512_loadu_ps(value);
  __m512i bi = _mm512_loadu_si512(index);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 v = _mm512_load_ps(out + r * kTileM);
    const __mmask16 take = _mm512_cmp_ps_mask(v, bv, _CMP_GT_OQ) |
                           (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(bv, bv, _CMP_ORD_Q));
    bv = _mm512_mask_blend_ps(take, bv, v);
    bi = _mm512_mask_blend_epi32(take, bi, _mm512_set1_epi32(static_cast<int32_t>(n0 + r)));
  }
  _mm512_storeu_ps(value, bv);
  _mm512_storeu_si512(index, bi);
}

// One block of up to 32 weight rows (as amx_rows_linear.cpp's block) folded into `best`.
void block_argmax(const uint16_t* w, int64_t lda, const uint32_t* xp, int64_t k_tiles, int64_t m_tiles,
                  int64_t n0, int64_t n_valid, const uint16_t* ahead, Best& best) {
  alignas(64) float out[kTileN * kTileM];
  for (int64_t g = 0; g < m_tiles; g += 2) {
    const bool two = g + 1 < m_tiles;
    block_tiles(w, lda, xp, k_tiles, m_tiles, g, two, ahead);
    for (int j = 0; j < (two ? 2 : 1); ++j) {
      for (int i = 0; i < 2; ++i) {  // the block's first 16 columns before its last 16
        const int64_t rows = n_valid - i * kTileN;
        if (rows <= 0) continue;
        store_tile(2 * i + j, out);
        fold(out, rows < kTileN ? rows : kTileN, n0 + i * kTileN, g + j, best);
      }
    }
  }
}

// More than two m tiles (33 rows and up, a batch's verification rows): block_argmax re-read each weight block
// once per pair of m tiles, and after a forward's layers the 48-row head took 22-26 ms against 15 at 32 rows.
// Here each 16-row weight tile is loaded once per k tile and multiplied into up to kWideTiles m tiles' C tiles
// (tiles 0-4; A in 5, B alternating in 6 and 7), so the weights are read once whatever M. Every logit still
// takes one TDPBF16PS per k tile, in k order, from its own row and column: the same bits as block_argmax.
constexpr int64_t kWideTiles = 5;

template <int M>
inline void wide_pass(const uint16_t* w, int64_t lda, const uint32_t* xp, int64_t k_tiles, int64_t m_tiles, int64_t g,
                      const uint16_t* ahead) {
  const int64_t stride = lda * 2;
  _tile_zero(0);
  if constexpr (M > 1) _tile_zero(1);
  if constexpr (M > 2) _tile_zero(2);
  if constexpr (M > 3) _tile_zero(3);
  if constexpr (M > 4) _tile_zero(4);
  for (int64_t t = 0; t < k_tiles; ++t) {
    const uint32_t* b = xp + (t * m_tiles + g) * kTileM * 16;
    if (ahead)
      for (int64_t r = 0; r < kTileN; ++r) _mm_prefetch(reinterpret_cast<const char*>(ahead + r * lda + t * kTileK), _MM_HINT_T1);
    _tile_loadd(5, w + t * kTileK, stride);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 5, 6);
    if constexpr (M > 1) {
      _tile_loadd(7, b + kTileM * 16, 64);
      _tile_dpbf16ps(1, 5, 7);
    }
    if constexpr (M > 2) {
      _tile_loadd(6, b + 2 * kTileM * 16, 64);
      _tile_dpbf16ps(2, 5, 6);
    }
    if constexpr (M > 3) {
      _tile_loadd(7, b + 3 * kTileM * 16, 64);
      _tile_dpbf16ps(3, 5, 7);
    }
    if constexpr (M > 4) {
      _tile_loadd(6, b + 4 * kTileM * 16, 64);
      _tile_dpbf16ps(4, 5, 6);
    }
  }
}

inline void store_c(int c, float* out) {
  switch (c) {
    case 0: _tile_stored(0, out, 64); break;
    case 1: _tile_stored(1, out, 64); break;
    case 2: _tile_stored(2, out, 64); break;
    case 3: _tile_stored(3, out, 64); break;
    default: _tile_stored(4, out, 64); break;
  }
}

// One block of up to 32 weight rows folded into `best`, as block_argmax, for any number of m tiles: per 16
// weight rows, passes of up to kWideTiles m tiles (the second half's weights are prefetched by the first).
void block_argmax_wide(const uint16_t* w, int64_t lda, const uint32_t* xp, int64_t k_tiles, int64_t m_tiles,
                       int64_t n0, int64_t n_valid, const uint16_t* ahead, Best& best) {
  alignas(64) float out[kTileN * kTileM];
  for (int i = 0; i < 2; ++i) {  // the block's first 16 weight rows before its last 16
    const int64_t rows = n_valid - i * kTileN;
    if (rows <= 0) continue;
    const uint16_t* wi = w + i * kTileN * lda;
    const uint16_t* pf = ahead ? ahead + i * kTileN * lda : nullptr;
    for (int64_t g = 0; g < m_tiles; g += kWideTiles) {
      const int64_t m = std::min<int64_t>(kWideTiles, m_tiles - g);
      const uint16_t* a = g == 0 ? pf : nullptr;
      switch (m) {
        case 1: wide_pass<1>(wi, lda, xp, k_tiles, m_tiles, g, a); break;
        case 2: wide_pass<2>(wi, lda, xp, k_tiles, m_tiles, g, a); break;
        case 3: wide_pass<3>(wi, lda, xp, k_tiles, m_tiles, g, a); break;
        case 4: wide_pass<4>(wi, lda, xp, k_tiles, m_tiles, g, a); break;
        default: wide_pass<5>(wi, lda, xp, k_tiles, m_tiles, g, a); break;
      }
      for (int64_t j = 0; j < m; ++j) {
        store_c(static_cast<int>(j), out);
        fold(out, rows < kTileN ? rows : kTileN, n0 + i * kTileN, g + j, best);
      }
    }
  }
}

}  // namespace

at::Tensor rows_argmax_linear(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K]");
  TORCH_CHECK(w.size(0) > 0 && w.size(0) <= std::numeric_limits<int32_t>::max(), "1 to 2^31 - 1 columns");
  TORCH_CHECK(x.size(1) > 0, "K must be positive");
  TORCH_CHECK(amx_permitted(), "the kernel could not get AMX tile state from the OS");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t m_size = x.size(0), k_size = x.size(1), n_size = w.size(0);
  auto result = at::empty({m_size}, x.options().dtype(at::kLong));
  if (m_size == 0) return result;
  const auto* xr = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wr = reinterpret_cast<const uint16_t*>(w.data_ptr());
  const int64_t k_tiles = (k_size + kTileK - 1) / kTileK, m_tiles = (m_size + kTileM - 1) / kTileM;
  const std::vector<uint32_t> xp = pack_x(xr, m_size, k_size, k_tiles, m_tiles);
  const int64_t blocks = (n_size + kBlockN - 1) / kBlockN;
  const bool k_exact = k_size % kTileK == 0;
  const int threads = at::get_num_threads();
  std::vector<Best> per_thread(static_cast<size_t>(threads), Best(m_tiles));
#pragma omp parallel num_threads(threads)
  {
    ThreadTiles tiles;
    std::vector<uint16_t> pad;
    Best& best = per_thread[static_cast<size_t>(omp_get_thread_num())];
    // schedule(static) without a chunk: thread t gets the t-th contiguous range, so the merge below is in
    // column order
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kBlockN, n_valid = n_size - n0 < kBlockN ? n_size - n0 : kBlockN;
      const auto block = m_tiles > 2 ? block_argmax_wide : block_argmax;
      if (k_exact && n_valid == kBlockN) {
        const bool pf = b + kPrefetchBlocks < blocks;
        block(wr + n0 * k_size, k_size, xp.data(), k_tiles, m_tiles, n0, n_valid,
              pf ? wr + (n0 + kPrefetchBlocks * kBlockN) * k_size : nullptr, best);
      } else {
        const int64_t lda = k_tiles * kTileK;
        pad_block(wr, k_size, n0, n_valid, lda, pad);
        block(pad.data(), lda, xp.data(), k_tiles, m_tiles, n0, n_valid, nullptr, best);
      }
    }
  }
  int64_t* out = result.data_ptr<int64_t>();
  for (int64_t m = 0; m < m_size; ++m) {
    float value = per_thread[0].value[m];
    int32_t index = per_thread[0].index[m];
    for (size_t t = 1; t < per_thread.size(); ++t) {
      const float v = per_thread[t].value[m];
      if (v > value || (std::isnan(v) && !std::isnan(value))) {
        value = v;
        index = per_thread[t].index[m];
      }
    }
    out[m] = index;
  }
  return result;
}

#pragma GCC pop_options
