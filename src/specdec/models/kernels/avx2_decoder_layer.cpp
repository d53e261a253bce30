// One decoder layer in a single call: the steps of decoder.DecoderLayer.forward_batch, the same kernels in the
// same order, so the same bits. Why: a one-row decode step is 10-17 ms, and the ~15 Python-level calls around
// each layer's four linears cost 1-2 ms of it (on the bfloat16 default model a twelfth of a plain step).
//
// The linears are any function with quant_linear's signature, handed over as a plain address: the quantized
// module's quant_linear (quantization/kernel.py, a separate extension built for the CPU's own ISA, calling
// the same libtorch), or, for bfloat16 weights kept in the AMX layout, amx_packed_layer_linear in this
// module (kernels/amx_packed_linear.cpp), the linear decoder.py's Python path runs for them.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

#include "layer_linear.h"

at::Tensor rms_norm_rows(at::Tensor x, at::Tensor scale, double eps, bool gemma);
at::Tensor rope_rows(at::Tensor x, at::Tensor cos, at::Tensor sin);
at::Tensor gated_act_mul(at::Tensor gate_up, bool gelu);
at::Tensor attention_batch(at::Tensor q, at::Tensor k, at::Tensor v, std::vector<at::Tensor> keys_t,
                           std::vector<at::Tensor> values, std::vector<at::Tensor> masks,
                           std::vector<at::Tensor> orders, std::vector<int64_t> starts, std::vector<int64_t> ends,
                           std::vector<int64_t> slots, at::Tensor positions, int64_t window, double scale,
                           std::vector<at::Tensor> keys_rows, std::vector<at::Tensor> values_t);

using specdec_layer::LayerLinear;
using specdec_layer::linear;

// h [N, hidden] bfloat16: the rows of every sequence. tiles: 4 per linear (qkv, o, gate_up, down) as
// QuantizedWeight keeps them (or the AMX-packed weight and three empty tensors), kinds and out_features per
// linear (for a packed weight both its output features). norms: input, qk (empty without qk norms),
// post_attn, pre_ffn and post_ffn (the last two empty without sandwich norms), as rms_norm_rows takes them.
// dims: num_heads, num_kv_heads, head_dim. The attention arguments are attention_batch's.
at::Tensor decoder_layer_call(at::Tensor h, int64_t linear_address, std::vector<at::Tensor> tiles,
                              std::vector<int64_t> kinds, std::vector<int64_t> out_features,
                              std::vector<at::Tensor> norms, double eps, bool gemma, bool gelu,
                              std::vector<int64_t> dims, at::Tensor cos, at::Tensor sin,
                              std::vector<at::Tensor> keys_t, std::vector<at::Tensor> values,
                              std::vector<at::Tensor> masks, std::vector<at::Tensor> orders,
                              std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> slots,
                              at::Tensor positions, int64_t window, double attn_scale,
                              std::vector<at::Tensor> keys_rows, std::vector<at::Tensor> values_t) {
  TORCH_CHECK(linear_address != 0 && tiles.size() == 16 && kinds.size() == 4 && out_features.size() == 4,
              "four linears");
  TORCH_CHECK(norms.size() == 5 && dims.size() == 3, "five norm scales and three dims");
  const auto fn = reinterpret_cast<LayerLinear>(linear_address);
  const int64_t t = h.size(0), heads = dims[0], kv_heads = dims[1], head_dim = dims[2];
  const bool qk_norm = norms[1].defined() && norms[1].numel() > 0;
  const bool sandwich = norms[3].defined() && norms[3].numel() > 0;

  at::Tensor x = rms_norm_rows(h, norms[0], eps, gemma);
  at::Tensor qkv = linear(fn, x, tiles, kinds, out_features, 0).view({t, heads + 2 * kv_heads, head_dim});
  at::Tensor qk = qkv.slice(1, 0, heads + kv_heads);
  const at::Tensor v = qkv.slice(1, heads + kv_heads);
  if (qk_norm) qk = rms_norm_rows(qk, norms[1], eps, gemma);
  qk = rope_rows(qk, cos, sin);
  const at::Tensor q = qk.slice(1, 0, heads), k = qk.slice(1, heads);
  at::Tensor attn = attention_batch(q, k, v, std::move(keys_t), std::move(values), std::move(masks),
                                    std::move(orders), std::move(starts), std::move(ends), std::move(slots),
                                    positions, window, attn_scale, std::move(keys_rows), std::move(values_t));
  attn = linear(fn, attn, tiles, kinds, out_features, 1);
  if (sandwich) {
    h = at::add(h, rms_norm_rows(attn, norms[2], eps, gemma));
    x = rms_norm_rows(h, norms[3], eps, gemma);
  } else {
    h = at::add(h, attn);
    x = rms_norm_rows(h, norms[2], eps, gemma);
  }
  const at::Tensor act_up = gated_act_mul(linear(fn, x, tiles, kinds, out_features, 2), gelu);
  at::Tensor out = linear(fn, act_up, tiles, kinds, out_features, 3);
  if (sandwich) out = rms_norm_rows(out, norms[4], eps, gemma);
  return at::add(h, out);
}
