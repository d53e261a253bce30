// rows_linear's bits for bfloat16 weights packed once into lane panels (avx2_lane_panels.h), for the 5-95 rows
// that verification and batches run, on CPUs with AVX2 + FMA.
//
// Why: there rows_linear's dot form is neither memory- nor FMA-bound (8 rows of Gemma 3 270M's layers took
// ~16 ms against ~9.5 ms for their bytes and ~9.5 ms for their FMAs), and re-laying a tile out on every call
// costs about as much as the outer product saves. So the decoder keeps a second copy of each layer's weights
// in this layout (fast_linear.pack_weight: the weight's size once more in memory) and calls this with both;
// fewer rows than kLanePanelRows keep to rows_linear on the weight itself, whose one-row form streams it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "avx2_lane_panels.h"

at::Tensor rows_linear(at::Tensor x, at::Tensor w);

namespace {

using namespace specdec_lanes;

#ifndef LANE_PANEL_ROWS
#define LANE_PANEL_ROWS 5
#endif
constexpr int64_t kLanePanelRows = LANE_PANEL_ROWS;

int64_t padded_k(int64_t k_size) { return (k_size + kChunk - 1) / kChunk * kChunk; }

int64_t packed_size(int64_t n_size, int64_t k_size) {
  return (n_size + kPanel - 1) / kPanel * kPanel * padded_k(k_size);
}

// y = x @ w.T through the packed copy (rows_linear's bits); y float32 [M, N]
at::Tensor packed_rows(const at::Tensor& x, int64_t n_size, const at::Tensor& packed) {
  const int64_t m_size = x.size(0), k_size = x.size(1), kp = padded_k(k_size);
  auto y = at::empty({m_size, n_size}, x.options().dtype(at::kFloat));
  auto xl = at::empty({m_size * kp}, x.options().dtype(at::kFloat));
  float* xlp = xl.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto* pp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const RowBlocks blocks = row_blocks(m_size);
  lane_rows(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), m_size, k_size, kp, blocks, xlp);
  const int64_t panel_size = kp * kPanel;
  over_tiles(n_size, [&](int64_t n0, int64_t cols, int64_t next_n0, int64_t next_cols) {
    const int64_t next_panels = (next_cols + kPanel - 1) / kPanel;
    panel_tile(pp + n0 / kPanel * panel_size, xlp, blocks, kp, yp + n0, n_size, cols,
               reinterpret_cast<const char*>(pp + next_n0 / kPanel * panel_size),
               next_panels * panel_size * static_cast<int64_t>(sizeof(uint16_t)));
  });
  return y;
}

}  // namespace

// w [N, K] bfloat16 -> its lane panels, bfloat16 [ceil(N / 16) * 16 * kp], zero past N and K: panel p, lane l,
// step t = 2j + e (k = 16j + 2l + e), column c at position 2c (c < 8) or 2(c - 8) + 1 of the step's 16.
at::Tensor lane_panel_pack(at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.device().is_cpu(), "a bfloat16 CPU w [N, K]");
  w = w.contiguous();
  const int64_t n_size = w.size(0), k_size = w.size(1), kp = padded_k(k_size), t_size = kp / kLanes;
  auto packed = at::zeros({packed_size(n_size, k_size)}, w.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  at::parallel_for(0, n_size, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t c = n % kPanel, pos = c < 8 ? 2 * c : 2 * (c - 8) + 1;
      uint16_t* panel = dst + n / kPanel * kp * kPanel;
      for (int64_t k = 0; k < k_size; ++k) {
        const int64_t l = k % kChunk / 2, t = k / kChunk * 2 + k % 2;
        panel[(l * t_size + t) * kPanel + pos] = src[n * k_size + k];
      }
    }
  });
  return packed;
}

// float32 x @ w.T for bfloat16 x [M, K], with the bits of rows_linear(x, w); packed = lane_panel_pack(w)
at::Tensor lane_panel_linear(at::Tensor x, at::Tensor w, at::Tensor packed) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K]");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() &&
                  packed.numel() == packed_size(w.size(0), w.size(1)),
              "packed must be lane_panel_pack(w)");
  if (x.size(0) < kLanePanelRows || w.size(0) == 0) return rows_linear(std::move(x), std::move(w));
  return packed_rows(x.contiguous(), w.size(0), packed);
}

namespace {

// lane_panel_linear with quant_linear's signature (layer_linear.h): `w` the bfloat16 weight, `packed` its lane
// panels, the other two tensors and the out-features count unused; rounded to bfloat16 for the layer
at::Tensor lane_panel_layer_linear(at::Tensor x, at::Tensor w, at::Tensor packed, at::Tensor, at::Tensor, int64_t,
                                   bool bf16_out) {
  at::Tensor y = lane_panel_linear(std::move(x), std::move(w), std::move(packed));
  return bf16_out ? y.to(at::kBFloat16) : y;
}

}  // namespace

int64_t lane_panel_layer_linear_address() { return reinterpret_cast<int64_t>(&lane_panel_layer_linear); }
