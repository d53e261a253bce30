// EAGLE-3's draft layer (drafting/eagle3_model.py's step_batch on the kernel path) in one call: the same
// kernels and torch ops in the same order, so the same bits.
//
// Why: a drafter step over a tree level is four linears and a small attention (about 0.35 ms of kernels on
// the default model's drafter), and the ~40 tensor ops around them from Python (norms, concatenation, the
// split into q, k and v, RoPE, the cache writes, the dtype conversions) cost about as much again: a 16-node
// tree grows over 6-7 levels a step, so they were a sixth of an EAGLE-3 step on short prompts.
//
// The linears are any function with quant_linear's signature, handed over as a plain address, as in
// decoder_layer_call (amx_packed_layer_linear for the drafter's AMX-packed weights).
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

#include "layer_linear.h"

at::Tensor rms_norm_rows(at::Tensor x, at::Tensor scale, double eps, bool gemma);
at::Tensor rope_rows(at::Tensor x, at::Tensor cos, at::Tensor sin);
at::Tensor gated_act_mul(at::Tensor gate_up, bool gelu);
at::Tensor draft_attention(at::Tensor q, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                           std::vector<int64_t> rows, double scale, std::vector<at::Tensor> slots);

using specdec_layer::LayerLinear;
using specdec_layer::linear;

// h [N, H] bfloat16: the fused features (or the previous level's outputs) of every sequence's new rows; e [N, H]
// bfloat16: their tokens' embeddings. tiles, kinds, out_features: 4 per linear (qkv stacked, o, gate_up
// stacked, down), as decoder_layer_call takes them. norms: hidden_norm, input_layernorm, post_attention_layernorm
// scales as rms_norm_rows takes them (Llama's weights in float32, `gemma` form: one multiply before the
// rounding). dims: heads, kv_heads, head_dim. cos and sin [N, D] bfloat16, sin signed as rope_rows takes it.
// Sequence i's rows[i] new keys and values are written into its cache buffers (k_bufs[i], v_bufs[i]
// [kv_heads, capacity, D], float32 or bfloat16: either holds the bfloat16 values exactly) from entry
// lengths[i] on; the caller advances its lengths. slots: draft_attention's.
// Returns the layer's outputs [N, H] bfloat16.
at::Tensor draft_layer_call(at::Tensor h, at::Tensor e, int64_t linear_address, std::vector<at::Tensor> tiles,
                            std::vector<int64_t> kinds, std::vector<int64_t> out_features,
                            std::vector<at::Tensor> norms, double eps, bool norm_before_residual,
                            std::vector<int64_t> dims, at::Tensor cos, at::Tensor sin, std::vector<at::Tensor> k_bufs,
                            std::vector<at::Tensor> v_bufs, std::vector<int64_t> lengths, std::vector<int64_t> rows,
                            double scale, std::vector<at::Tensor> slots) {
  TORCH_CHECK(linear_address != 0 && tiles.size() == 16 && kinds.size() == 4 && out_features.size() == 4,
              "four linears");
  TORCH_CHECK(norms.size() == 3 && dims.size() == 3, "three norm scales and three dims");
  TORCH_CHECK(k_bufs.size() == rows.size() && v_bufs.size() == rows.size() && lengths.size() == rows.size(),
              "a cache, a length and a row count per sequence");
  TORCH_CHECK(h.scalar_type() == at::kBFloat16 && e.scalar_type() == at::kBFloat16 && h.dim() == 2 &&
                  e.sizes() == h.sizes(), "bfloat16 h and e [N, H]");
  const auto fn = reinterpret_cast<LayerLinear>(linear_address);
  const int64_t n = h.size(0), heads = dims[0], kv_heads = dims[1], head_dim = dims[2];
  int64_t total = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    TORCH_CHECK((k_bufs[i].scalar_type() == at::kFloat || k_bufs[i].scalar_type() == at::kBFloat16) &&
                    v_bufs[i].scalar_type() == k_bufs[i].scalar_type() && k_bufs[i].dim() == 3 &&
                    k_bufs[i].size(0) == kv_heads && k_bufs[i].size(2) == head_dim &&
                    v_bufs[i].sizes() == k_bufs[i].sizes(),
                "float32 or bfloat16 caches [kv_heads, capacity, head_dim]");
    TORCH_CHECK(rows[i] >= 0 && lengths[i] >= 0 && lengths[i] + rows[i] <= k_bufs[i].size(1),
                "draft KV cache full (", k_bufs[i].size(1), " entries)");
    total += rows[i];
  }
  TORCH_CHECK(total == n, total, " rows for ", n, " inputs");

  // _layer_input: [input_layernorm(e) | hidden_norm(h)], the residual
  const at::Tensor normed = rms_norm_rows(h, norms[0], eps, true);
  const at::Tensor residual = norm_before_residual ? normed : h;
  const at::Tensor x = at::cat({rms_norm_rows(e, norms[1], eps, true), normed}, -1);
  // qkv: one linear over the stacked weights, RoPE on q and k together (rope_rows: the bits of the torch ops)
  const at::Tensor qkv = linear(fn, x, tiles, kinds, out_features, 0).view({n, heads + 2 * kv_heads, head_dim});
  const at::Tensor qk = rope_rows(qkv.slice(1, 0, heads + kv_heads), cos, sin);  // [n, heads + kv_heads, D]
  const at::Tensor k = qk.slice(1, heads).transpose(0, 1), v = qkv.slice(1, heads + kv_heads).transpose(0, 1);
  // the caches' new entries (exact in either dtype), then every sequence's rows over its own cache
  std::vector<at::Tensor> keys, values;
  int64_t start = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    k_bufs[i].narrow(1, lengths[i], rows[i]).copy_(k.narrow(1, start, rows[i]));
    v_bufs[i].narrow(1, lengths[i], rows[i]).copy_(v.narrow(1, start, rows[i]));
    keys.push_back(k_bufs[i].narrow(1, 0, lengths[i] + rows[i]));
    values.push_back(v_bufs[i].narrow(1, 0, lengths[i] + rows[i]));
    start += rows[i];
  }
  const at::Tensor qf = qk.slice(1, 0, heads).transpose(0, 1).to(at::kFloat).contiguous();  // [heads, n, D]
  const at::Tensor attn = draft_attention(qf, std::move(keys), std::move(values), std::move(rows), scale,
                                          std::move(slots)).to(at::kBFloat16);
  // _layer_output: residual + o(attn), then + mlp(post_attention_layernorm(.))
  const at::Tensor o = linear(fn, attn.transpose(0, 1).reshape({n, heads * head_dim}), tiles, kinds, out_features, 1);
  const at::Tensor mid = at::add(residual, o);
  const at::Tensor act_up = gated_act_mul(linear(fn, rms_norm_rows(mid, norms[2], eps, true), tiles, kinds,
                                                 out_features, 2), false);
  return at::add(mid, linear(fn, act_up, tiles, kinds, out_features, 3));
}
