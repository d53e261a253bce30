// rows_linear with quant_linear's signature (layer_linear.h), so that the one-call layers (decoder_layer_call,
// draft_layer_call) also run bfloat16 weights kept as they are: the AVX2 and AVX512-BF16 builds' linears, and
// the AMX build's for a weight without a packed copy.
//
// Why: on an AVX2 CPU the default bfloat16 model ran its layers through decoder.py's Python path, whose ~15
// calls around each layer's four linears cost about a tenth of a one-row decode step. The output is rounded
// to bfloat16 as that path's fast_linear.linear rounds it, so every bit is the same.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

at::Tensor rows_linear(at::Tensor x, at::Tensor w);
#ifdef SPECDEC_AMX
at::Tensor rows_linear_bf16(at::Tensor x, at::Tensor w);
#endif

namespace {

// `w` the bfloat16 weight [N, K]; the three tensors after it and the out-features count are unused
at::Tensor rows_layer_linear(at::Tensor x, at::Tensor w, at::Tensor, at::Tensor, at::Tensor, int64_t, bool bf16_out) {
#ifdef SPECDEC_AMX
  if (bf16_out) return rows_linear_bf16(std::move(x), std::move(w));  // linear()'s rounding in that build
#endif
  at::Tensor y = rows_linear(std::move(x), std::move(w));
  return bf16_out ? y.to(at::kBFloat16) : y;
}

}  // namespace

int64_t rows_layer_linear_address() { return reinterpret_cast<int64_t>(&rows_layer_linear); }
