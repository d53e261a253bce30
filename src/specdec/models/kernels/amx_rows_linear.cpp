// y = x @ w.T for bfloat16 x [M, K] and w [N, K], float32 out, with Intel AMX (AMX-BF16 tile multiplies).
//
// Why: from about 8 rows on, the AVX512/AVX2 row kernels are compute-bound, so a batch of sequences or a
// prefill chunk costs nearly rows x one row. One AMX tile multiply does 16 x 16 x 32 bfloat16 products,
// so here the weights' memory traffic is the cost up to hundreds of rows. No library promises row
// independence (oneDNN's AMX GEMM and its GEMV paths round differently), hence this kernel.
//
// Row independence: the problem is computed transposed, C^T = w @ x^T. Weight rows are the tile
// multiply's A operand, loaded straight from w (16 output features x 32 k per tile, no repacking), and
// x is repacked once per call into the B operand's pair layout, its rows padded to 16. Output element
// (m, n) starts at zero and takes one TDPBF16PS per 32-wide k tile, in k order; each tile multiply
// computes an element from its own row of A and column of B only. So an element's bits never depend on
// M, on the other rows, on N slices, on the blocking or on the threads. K and N tails are zero-padded
// in a small copy, never read past the tensors.
//
// From kWideRows rows on (prefill chunks, wide verification steps) the tile multiplies rather than the
// weights' traffic are the cost, and the transposed form spends a third of its time re-reading the x tiles
// and gathering C's columns. There the problem is computed as it stands, C = x @ w^T: x rows are the A
// operand, loaded straight from x, and each block of 32 weight rows is transposed once per call into the
// B operand's pair layout. The multiply is commutative and the per-element k order is the same, so the
// bits are the transposed form's (tests/test_fast_linear.py checks both forms against each other).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "amx_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")  // this file only: the attention files stay AVX2

namespace {

using namespace specdec_amx;

// y[m][n0 + r] = out[r][m - m_first] for the tile's rows r < n_valid and columns m < m_size: one gather of
// a column and one store of 16 consecutive outputs per x row (a C tile is transposed against y). Out is
// float32 or, rounded as torch rounds, bfloat16 (no float32 pass over the output afterwards).
template <typename Out>
inline void store_transposed(const float* out, Out* y, int64_t n_size, int64_t n0, int64_t n_valid,
                             int64_t m_first, int64_t m_size) {
  const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(kTileM));
  const __mmask16 mask = first_lanes(n_valid);
  for (int64_t c = 0; c < kTileM && m_first + c < m_size; ++c)
    store_outputs(y + (m_first + c) * n_size + n0, mask, _mm512_i32gather_ps(column, out + c, 4));
}

// One block of up to 32 weight rows (w, row stride lda elements, k_tiles * 32 readable columns) against
// every x row; writes y[m][n0 + i] for the block's n_valid rows.
template <typename Out>
void block(const uint16_t* w, int64_t lda, const uint32_t* xp, int64_t k_tiles, int64_t m_tiles, int64_t m_size,
           Out* y, int64_t n_size, int64_t n0, int64_t n_valid, const uint16_t* ahead) {
  alignas(64) float out[kTileN * kTileM];
  for (int64_t g = 0; g < m_tiles; g += 2) {
    const bool two = g + 1 < m_tiles;
    block_tiles(w, lda, xp, k_tiles, m_tiles, g, two, ahead);
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < (two ? 2 : 1); ++j) {
        store_tile(2 * i + j, out);
        const int64_t rows = n_valid - i * kTileN;
        if (rows > 0) store_transposed(out, y, n_size, n0 + i * kTileN, rows, (g + j) * kTileM, m_size);
      }
    }
  }
}

constexpr int64_t kWideRows = 128;  // measured: below it the transposed form is as fast or faster (K = 640)

// The wide form (k_size a multiple of 32): C = x @ w^T, blocks of 32 weight rows on the threads, each packed
// once and multiplied against every 32-row group of x (the last group from a zero-padded copy).
template <typename Out>
void wide_linear_into(const uint16_t* xr, const uint16_t* wr, int64_t m_size, int64_t k_size, int64_t n_size, Out* yp) {
  const int64_t k_tiles = k_size / kTileK, blocks = (n_size + kBlockN - 1) / kBlockN;
  const int64_t full = m_size / (2 * kTileM) * (2 * kTileM), tail = m_size - full;
  std::vector<uint16_t> xtail(tail ? static_cast<size_t>(2 * kTileM * k_size) : 0, 0);
  if (tail) std::memcpy(xtail.data(), xr + full * k_size, static_cast<size_t>(tail * k_size) * 2);
#pragma omp parallel num_threads(at::get_num_threads())
  {
    ThreadTiles tiles;
    std::vector<uint32_t> packed(static_cast<size_t>(k_tiles * 2 * 256));
    std::vector<uint16_t> pad;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kBlockN, n_valid = n_size - n0 < kBlockN ? n_size - n0 : kBlockN;
      if (n_valid == kBlockN) {
        pack_w_block(wr + n0 * k_size, k_size, k_tiles, packed.data());
      } else {
        pad_block(wr, k_size, n0, n_valid, k_size, pad);
        pack_w_block(pad.data(), k_size, k_tiles, packed.data());
      }
      packed_block_rows(xr, k_size, m_size, full, xtail.data(), packed.data(), k_tiles, yp, n_size, n0, n_valid,
                        nullptr);
    }
  }
}

// y = x @ w.T into y [M, N] (float32, or uint16_t for bfloat16).
template <typename Out>
void linear_into(const at::Tensor& x, const at::Tensor& w, Out* yp) {
  const int64_t m_size = x.size(0), k_size = x.size(1), n_size = w.size(0);
  const auto* xr = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wr = reinterpret_cast<const uint16_t*>(w.data_ptr());
  if (m_size >= kWideRows && k_size % kTileK == 0) return wide_linear_into(xr, wr, m_size, k_size, n_size, yp);
  const int64_t k_tiles = (k_size + kTileK - 1) / kTileK, m_tiles = (m_size + kTileM - 1) / kTileM;
  const std::vector<uint32_t> xp = pack_x(xr, m_size, k_size, k_tiles, m_tiles);
  const int64_t blocks = (n_size + kBlockN - 1) / kBlockN;
  const bool k_exact = k_size % kTileK == 0;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    ThreadTiles tiles;
    std::vector<uint16_t> pad;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kBlockN, n_valid = n_size - n0 < kBlockN ? n_size - n0 : kBlockN;
      if (k_exact && n_valid == kBlockN) {
        const bool pf = b + kPrefetchBlocks < blocks;  // DRAM reads overlap the tile multiplies only when asked for
        block(wr + n0 * k_size, k_size, xp.data(), k_tiles, m_tiles, m_size, yp, n_size, n0, n_valid,
              pf ? wr + (n0 + kPrefetchBlocks * kBlockN) * k_size : nullptr);
      } else {
        const int64_t lda = k_tiles * kTileK;
        pad_block(wr, k_size, n0, n_valid, lda, pad);
        block(pad.data(), lda, xp.data(), k_tiles, m_tiles, m_size, yp, n_size, n0, n_valid, nullptr);
      }
    }
  }
}

// The inputs checked and made contiguous, y allocated; false when there is nothing to multiply (y is then
// empty or zeros).
bool prepare(at::Tensor& x, at::Tensor& w, at::Tensor& y, at::ScalarType out) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K]");
  TORCH_CHECK(amx_permitted(), "the kernel could not get AMX tile state from the OS");
  x = x.contiguous();
  w = w.contiguous();
  y = at::empty({x.size(0), w.size(0)}, x.options().dtype(out));
  if (x.size(0) == 0 || w.size(0) == 0) return false;
  if (x.size(1) == 0) {
    y.zero_();
    return false;
  }
  return true;
}

}  // namespace

bool amx_ready() { return amx_permitted(); }

at::Tensor rows_linear(at::Tensor x, at::Tensor w) {
  at::Tensor y;
  if (prepare(x, w, y, at::kFloat)) linear_into(x, w, y.data_ptr<float>());
  return y;
}

at::Tensor rows_linear_bf16(at::Tensor x, at::Tensor w) {
  at::Tensor y;
  if (prepare(x, w, y, at::kBFloat16)) linear_into(x, w, reinterpret_cast<uint16_t*>(y.data_ptr()));
  return y;
}

#pragma GCC pop_options
