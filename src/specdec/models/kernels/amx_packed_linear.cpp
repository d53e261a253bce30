// Linear layers whose bfloat16 weights were packed once, at load, in the AMX tile multiply's B layout.
//
// Why: amx_rows_linear.cpp reads the weights as they are stored, so every call either gathers C's columns
// (the transposed form, which a decode step's 32 rows spend as much time on as on the multiplies) or
// transposes each weight block into the B layout again (its wide form). Packed once, every call is the
// untransposed form without either: the weights stream from memory in 1 KB tiles, and the x tiles and C
// tiles are read and written as they stand.
//
// Same bits as rows_linear: each output element takes one TDPBF16PS per 32-wide k tile, in k order, from
// its own row of x and column of w (amx_tiles.h), zero-padded past K; tests/test_packed_linear.py checks it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "amx_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

namespace {

using namespace specdec_amx;

constexpr int64_t kBlockWords = 2 * 256;  // one k tile of a 32-column block: two 1 KB B tiles

// Rows per pass over the weights: a chunk of x (256 rows x K = 640 is 320 KB) stays in each core's L2 while
// every weight block multiplies it. Without the chunks, a prefill of thousands of rows re-read all of x
// from L3 once per 32-column block.
constexpr int64_t kChunkRows = 256;

template <typename Out>
void packed_into(const uint16_t* xr, int64_t lda, int64_t m_size, const uint32_t* packed, int64_t blocks,
                 int64_t k_tiles, int64_t n_size, Out* yp) {
  const int64_t full = m_size / (2 * kTileM) * (2 * kTileM), tail = m_size - full;
  std::vector<uint16_t> xtail(tail ? static_cast<size_t>(2 * kTileM * lda) : 0, 0);
  if (tail) std::memcpy(xtail.data(), xr + full * lda, static_cast<size_t>(tail * lda) * 2);
  const int64_t block_words = k_tiles * kBlockWords;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    ThreadTiles tiles;
    for (int64_t m0 = 0; m0 < m_size; m0 += kChunkRows) {  // kChunkRows is a multiple of 32: only the last has a tail
      const int64_t rows = std::min(kChunkRows, m_size - m0), chunk_full = std::min(full - m0, rows);
#pragma omp for schedule(static)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * kBlockN, n_valid = n_size - n0 < kBlockN ? n_size - n0 : kBlockN;
        const uint32_t* ahead = b + kPrefetchBlocks < blocks ? packed + (b + kPrefetchBlocks) * block_words : nullptr;
        packed_block_rows(xr + m0 * lda, lda, rows, chunk_full, xtail.data(), packed + b * block_words, k_tiles,
                          yp + m0 * n_size, n_size, n0, n_valid, ahead);
      }
    }
  }
}

}  // namespace

// w [N, K] bfloat16 -> int32 [ceil(N / 32), ceil(K / 32) * 512]: per block of 32 weight rows and k tile, the
// two B tiles (pack_w_block's layout), zero past N and K.
at::Tensor amx_pack_weight(at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.size(0) > 0 && w.size(1) > 0,
              "a non-empty bfloat16 weight [N, K]");
  w = w.contiguous();
  const int64_t n_size = w.size(0), k_size = w.size(1);
  const int64_t k_tiles = (k_size + kTileK - 1) / kTileK, blocks = (n_size + kBlockN - 1) / kBlockN;
  auto packed = at::empty({blocks, k_tiles * kBlockWords}, w.options().dtype(at::kInt));
  const auto* wr = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* pp = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  const int64_t lda = k_tiles * kTileK;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<uint16_t> pad;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kBlockN, n_valid = n_size - n0 < kBlockN ? n_size - n0 : kBlockN;
      if (n_valid == kBlockN && lda == k_size) {
        pack_w_block(wr + n0 * k_size, k_size, k_tiles, pp + b * k_tiles * kBlockWords);
      } else {
        pad_block(wr, k_size, n0, n_valid, lda, pad);
        pack_w_block(pad.data(), lda, k_tiles, pp + b * k_tiles * kBlockWords);
      }
    }
  });
  return packed;
}

// x [M, K] bfloat16 @ w.T for amx_pack_weight(w) (w had n_size rows): float32, or bfloat16 rounded as
// .to(torch.bfloat16) rounds (bf16_out).
at::Tensor amx_packed_linear(at::Tensor x, at::Tensor packed, int64_t n_size, bool bf16_out) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "bfloat16 x [M, K]");
  TORCH_CHECK(packed.scalar_type() == at::kInt && packed.dim() == 2 && packed.is_contiguous(), "packed weights");
  const int64_t m_size = x.size(0), k_size = x.size(1), blocks = packed.size(0);
  const int64_t k_tiles = packed.size(1) / kBlockWords;
  TORCH_CHECK(k_size > 0 && (k_size + kTileK - 1) / kTileK == k_tiles && packed.size(1) == k_tiles * kBlockWords,
              "x's K does not match the packed weight");
  TORCH_CHECK(n_size > 0 && (n_size + kBlockN - 1) / kBlockN == blocks, "n_size does not match the packed weight");
  TORCH_CHECK(amx_permitted(), "the kernel could not get AMX tile state from the OS");
  auto y = at::empty({m_size, n_size}, x.options().dtype(bf16_out ? at::kBFloat16 : at::kFloat));
  if (m_size == 0) return y;
  x = x.contiguous();
  const int64_t lda = k_tiles * kTileK;
  std::vector<uint16_t> padded;  // x's rows zero-padded to whole k tiles, when K is not a multiple of 32
  const auto* xr = reinterpret_cast<const uint16_t*>(x.data_ptr());
  if (lda != k_size) {
    padded.assign(static_cast<size_t>(m_size * lda), 0);
    for (int64_t m = 0; m < m_size; ++m) std::memcpy(padded.data() + m * lda, xr + m * k_size, k_size * 2);
    xr = padded.data();
  }
  const auto* pp = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  if (bf16_out)
    packed_into(xr, lda, m_size, pp, blocks, k_tiles, n_size, reinterpret_cast<uint16_t*>(y.data_ptr()));
  else
    packed_into(xr, lda, m_size, pp, blocks, k_tiles, n_size, y.data_ptr<float>());
  return y;
}

#pragma GCC pop_options

namespace {

// amx_packed_linear with the quantized module's quant_linear signature, for decoder_layer_call
// (kernels/avx2_decoder_layer.cpp): `packed` the weight in the AMX layout, `n_size` its output features; the
// three tensors between them are unused.
at::Tensor amx_packed_layer_linear(at::Tensor x, at::Tensor packed, at::Tensor, at::Tensor, at::Tensor,
                                   int64_t n_size, bool bf16_out) {
  return amx_packed_linear(std::move(x), std::move(packed), n_size, bf16_out);
}

}  // namespace

int64_t amx_packed_layer_linear_address() { return reinterpret_cast<int64_t>(&amx_packed_layer_linear); }
