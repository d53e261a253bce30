// A layer's linears handed to a one-call layer (decoder_layer_call, draft_layer_call) as a plain function
// address with quant_linear's signature: the quantized module's quant_linear, or amx_packed_layer_linear for
// bfloat16 weights kept in the AMX layout.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace specdec_layer {

using LayerLinear = at::Tensor (*)(at::Tensor x, at::Tensor quants, at::Tensor scales, at::Tensor mins,
                                   at::Tensor sub_scales, int64_t kind, bool out_bf16);

// Linear i (4 tiles each): x @ W_i.T in bfloat16, the padding columns of a quantized last tile left out
inline at::Tensor linear(LayerLinear fn, const at::Tensor& x, const std::vector<at::Tensor>& tiles,
                         const std::vector<int64_t>& kinds, const std::vector<int64_t>& out_features, int i) {
  at::Tensor y = fn(x, tiles[4 * i], tiles[4 * i + 1], tiles[4 * i + 2], tiles[4 * i + 3], kinds[i], true);
  return y.size(1) == out_features[i] ? y : y.narrow(1, 0, out_features[i]);
}

}  // namespace specdec_layer
